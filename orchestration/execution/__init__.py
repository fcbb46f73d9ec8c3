"""The step execution: one delivery of a step task, in as few transactions as its phase needs.

* :mod:`.entry`: the fence, the heartbeat and the read, in one transaction;
* :mod:`.starting`: the provider start, claimed in that same transaction;
* :mod:`.observing`: what an observation of the turn means (finish, fail, park, poll again);
* :mod:`.finishing`: completing a step and moving the run, in one transaction;
* :mod:`.calls`: the provider calls, their answers made fit to store;
* :mod:`.retrying`: ending an attempt its ``retry`` lists, and holding the next one back;
* :mod:`.parking`, :mod:`.rows`: parks, row locks, and ending a run from its own step;
* :mod:`.stepper`: the sequence of transactions and provider calls of one execution.
"""

from orchestration.execution.outcomes import Halt, Outcome, Poll, Proceed
from orchestration.execution.stepper import Stepper

__all__ = ["Halt", "Outcome", "Poll", "Proceed", "Stepper"]
