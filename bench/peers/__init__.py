"""The peers a user would pick instead of the engine, timed on item 1's work (a chain of
no-op steps): each from its own virtualenv, in the same rounds as the engine's chain."""
