"""The vocabulary and the persistence: states, errors, settings, tables, how a decision's
statements are sent, and the database's own guard of the state machine."""
