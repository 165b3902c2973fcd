"""The confirm's record of a run, written on the host from the release's event log.

A runner confirms without any controller, so what the controller used to
send with its confirm — when the run finished, how long each step took,
the gate's verdict and the new server's figures — is worked out here from
what the host itself recorded: the steps' events (host clock), the gate
step's judgement (``gate_judged.json``) and the steps before the commit
that the controller wrote with its commit (``steps``).

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

import os
import time

from .executor import GATE_JUDGED, PROBE_ANSWERS, step_events
from .files import read_record, write_json
from .state import op_release_log, op_release_update
from .wire import expand

STEPS_FILE = "steps.json"  # the controller's steps before the commit (``shell/program.py``)

PHASES = (
    ("restart", ("before_stop", "baseline", "stop", "switch", "start")),
    ("health", ("health",)),
    ("gate", ("gate",)),
    ("probe", ("probe",)),  # a night's
    ("confirm", ("after_healthy", "confirm")),
)
"""The run's step names (``pipeline/timings.py``) and the program steps each spans."""


def phase_steps(events, now):
    """``[{"step", "at", "seconds"}]`` of the program's phases, on the host's clock."""
    began, ended = {}, {}
    for e in events:
        if e.state == "began":
            began.setdefault(e.step, e.at)
        else:
            ended[e.step] = e.at + 0.0
    out = []
    for name, parts in PHASES:
        starts = [began[p] for p in parts if p in began]
        if not starts:
            continue
        ends = [ended[p] for p in parts if p in ended] or [now]
        out.append({"step": name, "at": round(min(starts), 3), "seconds": round(max(max(ends), min(starts)) - min(starts), 3)})
    return out


def night_probe(release_dir, probe):
    """A night's probe as its records keep it (``ProbeResult.to_json``), from the answers
    the PROBE step kept; None where it kept none."""
    from .figures import probe_result

    answers = read_record(os.path.join(release_dir, PROBE_ANSWERS))
    if not isinstance(answers, list):
        return None
    return probe_result(str(probe.get("post")), int(probe.get("concurrency") or 1), answers).to_json()


def op_release_stamp(s, state_dir, release_id, release_dir, started, steps, gate=None, probe=None, manifest=None,
                     fields=None):
    """Set the release's ``finished``, ``duration``, ``steps``, ``timings`` (and with a gate
    its ``gate`` and ``probe``) in its manifest, with ``fields`` (the confirm's outcome: one
    write of the manifest, not two); add the program's steps to its run log.

    A night's: ``probe`` (its ``post`` and ``concurrency``) sums up the PROBE step's
    answers into the release's ``probe`` (``figures.probe_result``, the controller's
    ``read_probe``); ``manifest`` (``path``, ``record``) is the build's manifest.json,
    written with the run's ``finished`` and that probe."""
    release_dir = expand(release_dir)
    now = time.time()
    events = step_events(release_dir)
    written = read_record(os.path.join(release_dir, STEPS_FILE)) or {}  # the commit's batch wrote it
    started = written.get("started", started)
    steps = written.get("steps") or steps
    before = [dict(st) for st in steps if isinstance(st, dict)]
    first = min([e.at for e in events] or [now])
    for st in before:
        if st.get("seconds") is None:  # the commit: until the program's first step
            st["seconds"] = round(max(0.0, first - float(st.get("at") or first)), 3)
    on_host = phase_steps(events, now)
    every = before + on_host
    fields = dict(fields or {}, finished=now, duration=round(now - float(started), 3), steps=every,
                  timings=dict((st["step"], st["seconds"]) for st in every))
    judged = read_record(os.path.join(release_dir, GATE_JUDGED)) if gate else None
    if gate and isinstance(judged, dict):
        after = judged.get("after") or {}
        probes = [dict(p, result=after[p["label"]]) for p in gate.get("probes") or [] if p.get("label") in after]
        fields["gate"] = judged.get("outcome")
        fields["probe"] = {"base_url": gate.get("base_url"),
                           "summary": probes[0]["result"].get("summary") if probes else None, "probes": probes}
    if probe:
        fields["probe"] = night_probe(release_dir, probe)
    if manifest:
        record = dict(manifest.get("record") or {}, finished=now, probe=fields.get("probe"))
        write_json(expand(str(manifest["path"])), record)
    op_release_update(s, state_dir, release_id, fields)
    lines = ["%s %s: %.1f s\n" % (time.strftime("%H:%M:%S", time.gmtime(st["at"])), st["step"], st["seconds"])
             for st in on_host]
    if lines:
        op_release_log(s, state_dir, release_id, "".join(["on the host (UTC):\n"] + lines))
    return fields
