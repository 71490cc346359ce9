"""Schemathesis hooks of Caret's API run (crates/caret/tests/api.rs).

The run fuzzes as one tenant ("alice") while another ("bob") has data on the same server. Bob's
identifiers come in CARET_FUZZ_VICTIM (JSON: his "workspace", "run", "session" and "secret",
the "private" values alice must never see, the "server_named" ids she cannot have herself, and
alice's "own" workspace and run):
 - generated requests often name bob's objects in their path (his workspace, run and session
   ids, his secret's name), so the tenant checks are hit on purpose, not by luck;
 - no answer to alice may hold one of bob's private values that her request did not carry
   itself, nor one she made her own (a workspace id or a secret name is the client's to choose:
   once alice has created hers by the same name, her listings may show it);
 - a request naming an object only the server names (a run, a session) gets no 2xx for alice.
The workers' and operators' routes serve every tenant by design (an operator's token) and are
left out of these checks.
"""

import json
import os
import random
import re

import schemathesis

VICTIM = json.loads(os.environ["CARET_FUZZ_VICTIM"])
PRIVATE = VICTIM["private"]
SERVER_NAMED = set(VICTIM["server_named"])
# Objects by the paths that name them, and the shape of a valid name there: only a valid
# generated name is swapped, for bob's or for alice's own (which takes the request past the
# lookup, deeper into the route), so a case generated to be invalid stays invalid.
OWN = VICTIM["own"]
KINDS = [
    ("/v1/workspaces/", "id", re.compile(r"[a-z0-9]{1,64}"), VICTIM["workspace"], OWN.get("workspace")),
    ("/v1/runs/", "id", re.compile(r".{1,128}", re.S), VICTIM["run"], OWN.get("run")),
    ("/v1/agent/sessions/", "id", re.compile(r".{1,128}", re.S), VICTIM["session"], None),
    ("/v1/secrets/", "name", re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}"), VICTIM["secret"], None),
]
# Bob's client-chosen names that alice has since used for objects of her own.
ALICES_OWN = set()
OPERATORS = ("/v1/workers/", "/v1/fleet")
# Hypothesis seeds the global `random` the same way for every example: a generator of our own.
RNG = random.Random(os.environ.get("CARET_FUZZ_SEED"))


@schemathesis.hook
def map_path_parameters(ctx, path_parameters):
    if not path_parameters or ctx.operation is None:
        return path_parameters
    for prefix, name, valid, bobs, alices in KINDS:
        current = path_parameters.get(name)
        if ctx.operation.path.startswith(prefix) and isinstance(current, str) and valid.fullmatch(current):
            draw = RNG.random()
            if draw < 0.3:
                path_parameters[name] = bobs
            elif draw < 0.6 and alices is not None:
                path_parameters[name] = alices
    return path_parameters


def _sent(case):
    parts = [case.formatted_path, json.dumps(case.path_parameters or {}), json.dumps(case.query or {})]
    try:
        parts.append(json.dumps(case.body))
    except (TypeError, ValueError):
        parts.append(repr(case.body))
    return "".join(parts)


@schemathesis.check
def no_other_tenants_data(ctx, response, case):
    """Alice's answers hold nothing of bob's she did not send herself."""
    if case.path.startswith(OPERATORS):
        # Workers and operators serve every tenant: their token is not a tenant's.
        return
    text = response.text or ""
    sent = _sent(case)
    if case.method.upper() == "PUT" and 200 <= response.status_code < 300:
        ALICES_OWN.update(v for v in (case.path_parameters or {}).values() if v in PRIVATE)
    for value in PRIVATE:
        if value in text and value not in sent and value not in ALICES_OWN:
            raise AssertionError(f"the answer holds another tenant's {value!r}")
    named = [v for v in (case.path_parameters or {}).values() if v in SERVER_NAMED]
    if named and 200 <= response.status_code < 300:
        raise AssertionError(f"another tenant's object {named[0]!r} answered {response.status_code}")
