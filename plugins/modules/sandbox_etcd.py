#!/usr/bin/python
# ruff: noqa: EXE001 -- an Ansible module: the shebang names its interpreter, the file is not executable
"""The etcd operations every caller shares, each written once: who leads, move leadership off
a member, wait until healthy, wait until the members' data is equal, promote a learner.

Run on a member with the etcdctl wrapper roles/etcd installs (its endpoints and admin
certificate preset), so a task needs no URLs or certificates. Each operation reads what it
needs in one module run and, where it waits, polls with a deadline (``timeout`` seconds)
instead of Ansible's ``until``/``retries``: a wait that needs two etcdctl calls per attempt
(the data comparison: a revision, then the hashes at that revision) stays one attempt.

Callers: roles/etcd (start, restart, join, replace, remove, restore, upgrade, defrag),
roles/sandbox_verify (the hashkv check of verify.yml) and the Molecule scenarios. The logic
is in plain functions below (tests/test_sandbox_etcd.py runs them on etcdctl's JSON and the
module itself on a real etcd cluster).
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sandbox_etcd
author: k0s-etcd-sandbox project (!UNKNOWN)
short_description: One etcd operation through the member's etcdctl wrapper
description:
  - O(op=status) reads every member's status and the member list; returns the members with
    name, ID, endpoint, version, revision, database size, learner and leader, the leader and
    the names in order with the leader last. With O(timeout) it waits until a leader is known
    (and O(count) members answer).
  - O(op=move_leader) moves leadership off the member O(member) when it leads, to the first
    answering voting member of O(prefer), else one running O(prefer_version), else any other.
  - O(op=healthy) waits until C(endpoint health) passes on every URL of O(endpoints), every
    member of O(members) and, with O(cluster), on the whole cluster.
  - O(op=data_equal) waits until the members (O(endpoints), O(members), else the whole cluster)
    report the same C(hashkv) at ONE revision, the lowest any of them has applied (at the
    head revision the hashes differ under writes without anything being wrong); when all
    report one revision, their head (an idle cluster compacted at its head refuses C(--rev)
    at the compacted revision).
  - O(op=promote) promotes the learner with peer URL O(peer_url) once etcd says it is in sync,
    asking the leader's own endpoint (a follower forwards without the caller's credentials).
  - With O(require=false) a wait that ends at its deadline returns C(ok=false) instead of failing.
options:
  op:
    description: The operation.
    type: str
    required: true
    choices: [status, move_leader, healthy, data_equal, promote]
  etcdctl:
    description: The etcdctl wrapper (roles/etcd etcd_etcdctl); looked up on PATH and in /usr/local/bin.
    type: str
    default: etcdctl
  endpoints:
    description: Client URLs to ask (healthy, data_equal); the wrapper's own for status.
    type: list
    elements: str
    default: []
  members:
    description: Member names to ask (healthy, data_equal), resolved through the member list.
    type: list
    elements: str
    default: []
  cluster:
    description: healthy also asks the whole cluster (C(--cluster)); data_equal asks every member when no endpoint or member is given.
    type: bool
    default: false
  count:
    description: How many members must answer (status, data_equal); 0 = all asked (data_equal) or any (status).
    type: int
    default: 0
  member:
    description: move_leader, the member (name) leadership moves off.
    type: str
  prefer:
    description: move_leader, the members (names) to move it to, in order.
    type: list
    elements: str
    default: []
  prefer_version:
    description: move_leader, else a member running this etcd version.
    type: str
    default: ""
  peer_url:
    description: promote, the peer URL of the learner.
    type: str
  via:
    description: The client URL the member list and statuses are read through (default the wrapper's endpoints).
    type: str
    default: ""
  timeout:
    description: Seconds to wait (0 = one attempt).
    type: int
    default: 0
  require:
    description: Fail when the wait ends without success (false = return ok false).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Move leadership off a member before it is removed
  k0sbox.external_etcd.sandbox_etcd:
    op: move_leader
    etcdctl: /usr/local/bin/etcdctl-admin
    member: etcd-3
    prefer: [etcd-1, etcd-2]

- name: Wait until every member is healthy
  k0sbox.external_etcd.sandbox_etcd:
    op: health
    etcdctl: /usr/local/bin/etcdctl-admin
"""

RETURN = r"""
ok: {description: The condition held., type: bool, returned: always}
members: {description: "status: [{name, id, endpoint, version, revision, db_size, learner, leader}].", type: list, returned: status}
leader: {description: "status: the leader's entry ({} when none).", type: dict, returned: status}
order_leader_last: {description: "status: member names, the leader last.", type: list, returned: status}
moved_to: {description: "move_leader: the new leader's name ('' when nothing moved).", type: str, returned: move_leader}
revision: {description: "data_equal: the revision compared at.", type: int, returned: data_equal}
hashkv: {description: "data_equal: etcdctl's hashkv answers (JSON list).", type: list, returned: data_equal}
detail: {description: What was seen last (one line)., type: str, returned: always}
"""

import json
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.k0sbox.external_etcd.plugins.module_utils.etcdctl import (
    Etcdctl,
)

# -- etcdctl's JSON, read ------------------------------------------------------------------


def parse_json(text: str, empty: Any) -> Any:
    """etcdctl's -w json output; ``empty`` when there is none or it is not JSON (etcdctl
    prints the members that answered and exits non-zero when one did not)."""
    try:
        return json.loads(text)
    except ValueError:
        return empty


def member_view(status: list[dict[str, Any]], members: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per member of the member list, with what its status answer says (version
    and revision '' / 0 when it did not answer), in the member list's order."""
    by_id = {int(s.get("Status", {}).get("header", {}).get("member_id", -1)): s for s in status}
    out = []
    for m in members:
        mid = int(m.get("ID", 0))
        s = by_id.get(mid, {})
        st = s.get("Status", {})
        out.append({
            "name": m.get("name", ""),
            "id": f"{mid:x}",
            "endpoint": s.get("Endpoint") or (m.get("clientURLs") or [""])[0],
            "peer_urls": m.get("peerURLs") or [],
            "answered": bool(s),
            "version": st.get("version", ""),
            "revision": int(st.get("header", {}).get("revision", 0)),
            "db_size": int(st.get("dbSize", 0)),
            "learner": bool(m.get("isLearner", False)),
            "leader": bool(st) and st.get("leader") == st.get("header", {}).get("member_id"),
        })
    return out


def leader_of(view: list[dict[str, Any]]) -> dict[str, Any]:
    """The member that says it leads ({} when none does)."""
    return next((m for m in view if m["leader"]), {})


def leader_last(view: list[dict[str, Any]]) -> list[str]:
    """Member names, the leader last (the order of rolling work: one election at the end)."""
    return [m["name"] for m in view if not m["leader"]] + [m["name"] for m in view if m["leader"]]


def move_target(view: list[dict[str, Any]], off: str, prefer: list[str],
                prefer_version: str = "") -> dict[str, Any]:
    """Where leadership goes from ``off``: the first answering voting member named in
    ``prefer``, else one running ``prefer_version``, else the first other one ({} if none)."""
    others = [m for m in view if m["name"] != off and m["answered"] and not m["learner"]]
    for name in prefer:
        for m in others:
            if m["name"] == name:
                return m
    same = [m for m in others if prefer_version and m["version"] == prefer_version]
    return (same + others + [{}])[0]


def hashes_agree(hashkv: list[dict[str, Any]], count: int) -> tuple[bool, str]:
    """True when ``count`` members answered with one hash (and one compact revision: a
    member that has not applied a compaction yet hashes another range for a moment)."""
    hashes = {h.get("HashKV", {}).get("hash") for h in hashkv}
    compacted = {h.get("HashKV", {}).get("compact_revision") for h in hashkv}
    ok = len(hashkv) >= count > 0 and len(hashes) == 1 and len(compacted) == 1
    detail = (f"{len(hashkv)} of {count} member(s) answered, {len(hashes)} distinct hash(es) "
              f"({', '.join(str(h) for h in sorted(hashes, key=str))}), compact revision(s) "
              f"{', '.join(str(c) for c in sorted(compacted, key=str))}")
    return ok, detail


# -- the module ------------------------------------------------------------------------------


class Etcd:
    """etcdctl calls through the wrapper (module_utils/etcdctl.py), and the polling of the waits."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.etcdctl = Etcdctl(module.get_bin_path(module.params["etcdctl"], required=True,
                                                   opt_dirs=["/usr/local/bin"]), timeout=60)
        self.deadline = time.monotonic() + module.params["timeout"]
        self.via = module.params["via"]
        self.detail = ""

    def run(self, *args: str) -> tuple[int, str, str]:
        res = self.etcdctl.call(*args)
        return res.rc, res.text, res.stderr

    def view(self) -> list[dict[str, Any]]:
        """Every member of the member list with its status (member_view)."""
        via = [f"--endpoints={self.via}"] if self.via else []
        _rc, status, err = self.run(*via, "endpoint", "status", "--cluster", "-w", "json")
        rc, members, err2 = self.run(*via, "member", "list", "-w", "json")
        lines = (err + err2).strip().splitlines()
        self.detail = lines[-1] if lines else ""
        listed = parse_json(members, {}).get("members", []) if rc == 0 else []
        return member_view(parse_json(status, []), listed)

    def poll(self, attempt: Any) -> Any:
        """attempt() -> (done, value) until done or the deadline; the last value."""
        while True:
            done, value = attempt()
            if done or time.monotonic() >= self.deadline:
                return done, value
            time.sleep(1)

    def resolve(self, view: list[dict[str, Any]], names: list[str]) -> list[str]:
        urls = {m["name"]: m["endpoint"] for m in view}
        missing = [n for n in names if not urls.get(n)]
        if missing:
            self.module.fail_json(msg=f"members: {', '.join(missing)} not started members of "
                                      f"the cluster ({', '.join(urls) or 'no member answered'})")
        return [urls[n] for n in names]


def op_status(etcd: Etcd, p: dict[str, Any]) -> dict[str, Any]:
    def attempt() -> tuple[bool, list[dict[str, Any]]]:
        view = etcd.view()
        answered = [m for m in view if m["answered"]]
        return bool(leader_of(view)) and len(answered) >= max(p["count"], 1), view

    ok, view = etcd.poll(attempt)
    answered = len([m for m in view if m["answered"]])
    return {"ok": ok, "members": view, "leader": leader_of(view),
            "order_leader_last": leader_last(view),
            "detail": f"{answered} of {len(view)} member(s) answered; leader "
                      f"{leader_of(view).get('name') or 'none'} {etcd.detail}".strip()}


def op_move_leader(etcd: Etcd, p: dict[str, Any]) -> dict[str, Any]:
    view = etcd.view()
    leader = leader_of(view)
    if not leader or leader["name"] != p["member"]:
        return {"ok": True, "changed": False, "moved_to": "",
                "detail": f"{p['member']} does not lead ({leader.get('name') or 'no leader'})"}
    target = move_target(view, p["member"], p["prefer"], p["prefer_version"])
    if not target:
        etcd.module.fail_json(msg=f"move_leader: no other started voting member to move the "
                                  f"leadership of {p['member']} to")
    if etcd.module.check_mode:
        return {"ok": True, "changed": True, "moved_to": target["name"], "detail": "check mode"}
    rc, out, err = etcd.run(f"--endpoints={leader['endpoint']}", "move-leader", target["id"])
    if rc != 0:
        etcd.module.fail_json(msg=f"move-leader {p['member']} -> {target['name']}: {err.strip()}")
    return {"ok": True, "changed": True, "moved_to": target["name"], "detail": out.strip()}


def op_healthy(etcd: Etcd, p: dict[str, Any]) -> dict[str, Any]:
    def attempt() -> tuple[bool, str]:
        urls = list(p["endpoints"])
        if p["members"]:
            urls += etcd.resolve(etcd.view(), p["members"])
        asks = [[f"--endpoints={u}"] for u in urls] + ([["--cluster"]] if p["cluster"] else [])
        for ask in asks or [["--cluster"]]:
            rc, out, err = etcd.run("endpoint", "health", *ask)
            if rc != 0:
                return False, (err.strip() or out.strip()).splitlines()[-1:] or [f"rc {rc}"]
        return True, ["healthy: " + ", ".join(urls + (["the cluster"] if p["cluster"] else []))]

    ok, lines = etcd.poll(attempt)
    return {"ok": ok, "detail": lines[0] if lines else ""}


def op_data_equal(etcd: Etcd, p: dict[str, Any]) -> dict[str, Any]:
    def attempt() -> tuple[bool, dict[str, Any]]:
        view = etcd.view()
        urls = list(p["endpoints"]) + (etcd.resolve(view, p["members"]) if p["members"] else [])
        ask = [f"--endpoints={','.join(urls)}"] if urls else ["--cluster"]
        count = p["count"] or len(urls) or len(view)
        rc, out, err = etcd.run("endpoint", "status", *ask, "-w", "json")
        revisions = [int(s["Status"]["header"]["revision"]) for s in parse_json(out, [])]
        if not revisions:
            return False, {"revision": 0, "hashkv": [], "detail": err.strip() or "no status"}
        # The lowest revision any of them has applied: every member can hash it. When all are
        # at one revision, their head is hashed (no --rev): an idle cluster compacted at its
        # head refuses --rev at the compacted revision (mvcc: required revision has been
        # compacted), and a write landing meanwhile only costs another attempt.
        rev = min(revisions)
        at = [] if len(set(revisions)) == 1 else [f"--rev={rev}"]
        rc, out, err = etcd.run("endpoint", "hashkv", *ask, *at, "-w", "json")
        hashkv = parse_json(out, [])
        ok, detail = hashes_agree(hashkv, count)
        if rc != 0:
            detail += f"; {err.strip().splitlines()[-1] if err.strip() else f'rc {rc}'}"
        return ok and rc == 0, {"revision": rev, "hashkv": hashkv,
                                "detail": f"at revision {rev}: {detail}"}

    ok, seen = etcd.poll(attempt)
    return {"ok": ok, **seen}


def op_promote(etcd: Etcd, p: dict[str, Any]) -> dict[str, Any]:
    def attempt() -> tuple[bool, dict[str, Any]]:
        view = etcd.view()
        mine = [m for m in view if p["peer_url"] in m["peer_urls"]]
        if not mine:
            return False, {"changed": False, "detail": f"no member with peer URL {p['peer_url']}"}
        if not mine[0]["learner"]:
            return True, {"changed": False, "detail": "not a learner"}
        leader = leader_of(view)
        if not leader:
            return False, {"changed": False, "detail": "no leader"}
        rc, out, err = etcd.run(f"--endpoints={leader['endpoint']}", "member", "promote",
                                mine[0]["id"])
        return rc == 0, {"changed": rc == 0, "detail": (out.strip() or err.strip())}

    ok, seen = etcd.poll(attempt)
    return {"ok": ok, **seen}


OPS = {"status": op_status, "move_leader": op_move_leader, "healthy": op_healthy,
       "data_equal": op_data_equal, "promote": op_promote}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "op": {"type": "str", "required": True, "choices": list(OPS)},
            "etcdctl": {"type": "str", "default": "etcdctl"},
            "endpoints": {"type": "list", "elements": "str", "default": []},
            "members": {"type": "list", "elements": "str", "default": []},
            "cluster": {"type": "bool", "default": False},
            "count": {"type": "int", "default": 0},
            "member": {"type": "str"},
            "prefer": {"type": "list", "elements": "str", "default": []},
            "prefer_version": {"type": "str", "default": ""},
            "peer_url": {"type": "str"},
            "via": {"type": "str", "default": ""},
            "timeout": {"type": "int", "default": 0},
            "require": {"type": "bool", "default": True},
        },
        required_if=[("op", "move_leader", ["member"]), ("op", "promote", ["peer_url"])],
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode and p["op"] == "promote":
        module.exit_json(changed=False, ok=True, detail="check mode")
    result = OPS[p["op"]](Etcd(module), p)
    result.setdefault("changed", False)
    if not result["ok"] and p["require"]:
        module.fail_json(msg=f"etcd {p['op']}: not reached in {p['timeout']} s: "
                             f"{result.get('detail', '')}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
