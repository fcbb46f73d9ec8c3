"""What beat runs: the sweeper and its rules, schedule fires, retention, and the fleet's time
series."""
