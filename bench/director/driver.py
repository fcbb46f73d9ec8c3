"""Runs inside director's virtualenv: launch the benchmark workflow, time it to its end.

    DIRECTOR_HOME=... python driver.py REPEATS TIMEOUT

Launches the way director's API does (a ``Workflow`` row, then ``WorkflowBuilder.run``) and
polls the workflow's row until it is ``success`` or ``error``. Prints JSON seconds per run.
"""

import json
import sys
import time

from director import create_app
from director.builder import WorkflowBuilder
from director.extensions import db
from director.models import StatusType
from director.models.workflows import Workflow


def main():
    repeats, timeout = int(sys.argv[1]), float(sys.argv[2])
    app = create_app()
    seconds, statuses = [], []
    with app.app_context():
        for _ in range(repeats):
            started = time.time()
            workflow = Workflow(project="bench", name="CHAIN", payload={})
            workflow.save()
            WorkflowBuilder(workflow.id).run()
            deadline = time.monotonic() + timeout
            status = None
            while time.monotonic() < deadline:
                db.session.expire_all()
                status = Workflow.query.filter_by(id=workflow.id).first().status
                if status in (StatusType.success, StatusType.error):
                    break
                time.sleep(0.01)
            seconds.append(time.time() - started)
            statuses.append(status.value if status else None)
    print(json.dumps({"seconds": seconds, "statuses": statuses}))


if __name__ == "__main__":
    main()
