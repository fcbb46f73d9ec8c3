"""A run's lifecycle writes: launch, transitions, concurrency keys, chains, cancel, ending a
run, provider turns, effects, answers, reruns and artifacts."""
