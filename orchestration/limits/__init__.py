"""What a tenant may use: the bounds on values, secrets and their redaction, the budgets a
launch is admitted under and the counts behind them."""
