"""Runs scim2-tester (PyPI) against a SCIM endpoint and prints one JSON line per check.

    python3 scim_check.py BASE_URL TOKEN

BASE_URL is the server's `/scim/v2`; TOKEN the organisation's SCIM token. The Rust test
(crates/caret/tests/scim.rs) reads the lines and judges them.
"""

import json
import sys

import httpx2
from scim2_client.engines.httpx2 import SyncSCIMClient
from scim2_tester import check_server


def main() -> None:
    base, token = sys.argv[1], sys.argv[2]
    http = httpx2.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    client = SyncSCIMClient(http)
    for r in check_server(client):
        print(
            json.dumps(
                {
                    "status": r.status.name,
                    "title": r.title,
                    "resource": r.resource_type,
                    "reason": (r.reason or "")[:500],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
