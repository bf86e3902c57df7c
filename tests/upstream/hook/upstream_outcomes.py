"""A pytest plugin (``-p upstream_outcomes``) that writes each test's outcome, by node id, as
JSON to the file ``HOSTREG_DCP_OUTCOMES`` names: ``passed``, ``failed`` (its call failed),
``error`` (its setup or teardown failed) or ``skipped``. A test keeps the worst of its reports
(failed or error, then skipped, then passed): a failed teardown makes it an ``error`` even
where its call passed, and a skipped subtest makes it ``skipped``."""

import json
import os

_outcomes: dict[str, str] = {}
_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 2}


def pytest_runtest_logreport(report):  # type: ignore[no-untyped-def]
    now = _outcomes.get(report.nodeid)
    if report.when == "call" or report.skipped:
        got = "skipped" if report.skipped else report.outcome
    elif report.failed:
        got = "error"
    else:
        return
    if now is None or _RANK[got] > _RANK[now]:
        _outcomes[report.nodeid] = got


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    path = os.environ.get("HOSTREG_DCP_OUTCOMES")
    if path:
        with open(path, "w") as f:
            json.dump(_outcomes, f, indent=0, sort_keys=True)
