"""What ``modstage status`` shows: the host's :func:`~service.status.survey.survey` with who
signed each module (:mod:`service.status.signer_rows`, which parses the trusted certificates and
the stored signatures with the verify stack). The daemon's metrics need no signers and read
the survey alone (:mod:`service.status.metrics`)."""

from __future__ import annotations

from service.layout import Layout
from service.status.report import Report
from service.status.signer_rows import signer_rows
from service.status.survey import survey


def collect(layout: Layout, *, now: float | None = None) -> Report:
    """What ``status`` shows of the host under ``layout`` (``now``: epoch seconds)."""
    return survey(layout, now=now, signers=signer_rows)
