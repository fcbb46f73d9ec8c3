"""What the surfaces show: a run's record, lists of summaries, explain, the fleet."""
