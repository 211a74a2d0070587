"""What is known against the etcd a sandbox runs: the advisories that let one tenant of a shared
etcd read, change or stop another's data (or the whole cluster), matched against the version and
the build (``etcd --version``). Applied by the filter plugins/filter/sandbox_advisories.py
(verify's check, up's warning) and by scripts/sandboxlib (status), through
scripts/sandboxlib/sandbox_advisories.py, a link to this file.

The table is the project's reading of etcd's CHANGELOG-3.4/3.5/3.6 and advisories (2026-12-03,
2026-12-07; docs/security.md lists the sources), and two weaknesses no etcd release fixes
(one quota for all, etcd-io/etcd#10084; leases without an owner). A version is affected when its branch has the advisory
and the version is below the branch's first fixed release (``None``: never fixed on that
branch; a branch not listed is not affected). The sandbox's own build (scripts/build-etcd)
names in ``etcd --version``'s Git SHA line what its patches fix ("patched: ID, ID"): those are
not counted. Debian's own backports in its packages are not known here: a Debian build of an
affected version counts as affected.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Advisory:
    id: str
    cve: str
    what: str
    fixed: dict[str, str | None]
    url: str
    # a configuration it needs that the sandbox never sets ("" = none: always relevant)
    needs: str = ""


ADVISORIES: tuple[Advisory, ...] = (
    Advisory("etcd-io/etcd#22386", "",
             "while an alarm (NOSPACE) is raised, deletes, lease revokes, user and role changes "
             "and auth disable go unchecked: a tenant that fills the quota deletes other "
             "tenants' keys, grants itself root and turns auth off",
             {"3.4": None, "3.5": None}, "https://github.com/etcd-io/etcd/pull/22386"),
    Advisory("GHSA-xg4h-6gfc-h4m8", "CVE-2026-73499",
             "a watch from one of its own keys on streams the changes of every later key: "
             "other tenants' too",
             {"3.4": None, "3.5": "3.5.33", "3.6": "3.6.14"},
             "https://github.com/etcd-io/etcd/security/advisories/GHSA-xg4h-6gfc-h4m8"),
    Advisory("GHSA-rfx7-8w68-q57q", "CVE-2026-33343",
             "a nested transaction skips the key-range check: every tenant's keys read and "
             "written", {"3.4": "3.4.42", "3.5": "3.5.28", "3.6": "3.6.9"},
             "https://github.com/etcd-io/etcd/security/advisories/GHSA-rfx7-8w68-q57q"),
    Advisory("GHSA-q8m4-xhhv-38mg", "CVE-2026-33413",
             "any client, even without a user, raises or clears alarms, compacts the keyspace, "
             "moves the leader and uses other tenants' leases",
             {"3.4": "3.4.42", "3.5": "3.5.28", "3.6": "3.6.9"},
             "https://github.com/etcd-io/etcd/security/advisories/GHSA-q8m4-xhhv-38mg"),
    Advisory("GHSA-x35m-3gp4-4fh5", "CVE-2026-44283",
             "a put inside a transaction reads another tenant's value (prev_kv) or attaches to "
             "its lease", {"3.4": "3.4.44", "3.5": "3.5.30", "3.6": "3.6.11"},
             "https://github.com/etcd-io/etcd/security/advisories/GHSA-x35m-3gp4-4fh5"),
    Advisory("GHSA-6vch-q96h-7gc3", "CVE-2026-73500",
             "TLS connections that never finish their handshake pile up until the member runs "
             "out of memory (any client that reaches the port)",
             {"3.4": None, "3.5": "3.5.33", "3.6": "3.6.14"},
             "https://github.com/etcd-io/etcd/security/advisories/GHSA-6vch-q96h-7gc3"),
    Advisory("etcd-io/etcd#22167", "",
             "a transaction nested in a transaction costs nothing against the space quota: a "
             "tenant grows the database past the quota without limit, and goes on writing "
             "while NOSPACE refuses every other tenant's writes",
             {"3.4": None, "3.5": "3.5.33", "3.6": "3.6.14"},
             "https://github.com/etcd-io/etcd/pull/22167"),
    Advisory("etcd-io/etcd#22128", "",
             "no bound on the time a client takes to send its request headers: connections "
             "held open until the member runs out of file descriptors (any client that reaches "
             "the client port)",
             {"3.4": None, "3.5": "3.5.33", "3.6": "3.6.14"},
             "https://github.com/etcd-io/etcd/pull/22128"),
    Advisory("etcd-io/etcd#10084", "",
             "one space quota for the whole cluster and none per prefix: a tenant that fills "
             "it (NOSPACE) stops every tenant's writes until an operator frees space",
             {"3.4": None, "3.5": None, "3.6": None},
             "https://github.com/etcd-io/etcd/issues/10084"),
    Advisory("k0sbox-lease-owners", "",
             "a lease has no owner: a tenant attaches its key to another tenant's lease that "
             "has no key yet (its owner's puts with it are refused from then on), keeps it "
             "alive, revokes it, or takes the lease ID the server is about to give another "
             "tenant's grant",
             {"3.4": None, "3.5": None, "3.6": None},
             "docs/security.md#leases"),
    Advisory("GHSA-3p4g-rcw5-8298", "CVE-2023-32082",
             "LeaseTimeToLive lists the keys attached to another tenant's lease",
             {"3.4": "3.4.26", "3.5": "3.5.9"},
             "https://github.com/etcd-io/etcd/security/advisories/GHSA-3p4g-rcw5-8298"),
    Advisory("GHSA-3wh4-j44w-pg92", "CVE-2026-59818",
             "a revoked client certificate is still accepted over gRPC",
             {"3.5": "3.5.32", "3.6": "3.6.13"},
             "https://github.com/etcd-io/etcd/security/advisories/GHSA-3wh4-j44w-pg92",
             needs="--client-crl-file with --listen-client-http-urls (the sandbox sets neither)"),
)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def parse_version(text: str) -> tuple[str, str]:
    """(version, git_sha) from ``etcd --version``'s output ("etcd Version: 3.5.30",
    "Git SHA: ..."); ("", "") when it says neither."""
    version = re.search(r"etcd Version:\s*(\S+)", text or "")
    sha = re.search(r"Git SHA:\s*(.+)", text or "")
    return (version.group(1) if version else "",
            sha.group(1).strip() if sha else "")


def patched(git_sha: str) -> list[str]:
    """What the sandbox's build says it fixes (its Git SHA line: "... patched: A, B)")."""
    if "k0s-etcd-sandbox" not in git_sha or "patched:" not in git_sha:
        return []
    return [p.strip(" )") for p in git_sha.split("patched:", 1)[1].split(",") if p.strip(" )")]


def assess(version: str, git_sha: str = "") -> list[dict[str, Any]]:
    """Every advisory of the table with what it means for this build: ``state`` is
    affected, patched (the build's patch fixes it), fixed (the version has the fix),
    not-affected (its branch never had it) or not-relevant (needs a configuration the
    sandbox never sets); ``why`` says it in words."""
    if not re.match(r"^\d+\.\d+\.\d+", version or ""):
        return []
    branch = ".".join(version.split(".")[:2])
    fixes = set(patched(git_sha))
    out = []
    for adv in ADVISORIES:
        entry: dict[str, Any] = {"id": adv.id, "cve": adv.cve, "what": adv.what, "url": adv.url}
        if branch not in adv.fixed:
            entry.update(state="not-affected", why=f"etcd {branch} never had it")
        elif adv.fixed[branch] is not None and _key(version) >= _key(adv.fixed[branch] or ""):
            entry.update(state="fixed", why=f"fixed in {adv.fixed[branch]}")
        elif adv.id in fixes:
            entry.update(state="patched", why="this build's patch fixes it")
        elif adv.needs:
            entry.update(state="not-relevant", why=f"needs {adv.needs}")
        else:
            first = adv.fixed[branch]
            entry.update(state="affected",
                         why=(f"fixed in {first}" if first else f"no etcd {branch} release fixes it"))
        out.append(entry)
    return out


def affecting(version: str, git_sha: str = "", accepted: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The advisories the build is affected by, each marked ``accepted`` when the operator
    accepted it (etcd_accepted_advisories: its id or CVE)."""
    ok = set(accepted or ())
    return [{**a, "accepted": a["id"] in ok or (a["cve"] and a["cve"] in ok)}
            for a in assess(version, git_sha) if a["state"] == "affected"]


def build_line(version: str, git_sha: str) -> str:
    """How status names the build: "3.5.30 (sandbox build, patched: A, B)" or the version."""
    fixes = patched(git_sha)
    if fixes:
        return f"{version} (the sandbox's build, patched: {', '.join(fixes)})"
    return version


def summary(version: str, git_sha: str = "", accepted: Iterable[str] = ()) -> str:
    """One line: the build and what is known against it."""
    if not version:
        return "etcd's version unknown: no advisory checked"
    hit = affecting(version, git_sha, accepted)
    open_ = [a for a in hit if not a["accepted"]]
    if not hit:
        known = [a for a in assess(version, git_sha) if a["state"] == "patched"]
        return (f"etcd {build_line(version, git_sha)}: no known advisory"
                + (f" ({len(known)} fixed by its patches)" if known else ""))
    parts = [f"{a['id']}{' (accepted)' if a['accepted'] else ''}" for a in hit]
    return (f"etcd {build_line(version, git_sha)}: {len(hit)} known advisor"
            f"{'y' if len(hit) == 1 else 'ies'} ({', '.join(parts)})"
            + ("" if open_ else ": all accepted by the operator"))


def check(version_text: str, host: str, shared: bool, accepted: Iterable[str] = ()) -> dict[str, Any]:
    """verify's check for one member: FAIL when the build is affected by an advisory the
    operator did not accept and tenants share the cluster (``shared``: several tenants under
    etcd RBAC); with one tenant it passes and says what is known."""
    version, sha = parse_version(version_text)
    hit = [a for a in affecting(version, sha, accepted) if not a["accepted"]]
    name = f"{host}: etcd build's known advisories (tenant isolation)"
    detail = summary(version, sha, accepted)
    if hit and shared:
        detail += ("; FAIL: tenants share this etcd: " + "; ".join(
            f"{a['id']}: {a['what']} ({a['why']})" for a in hit)
            + ". Install the sandbox's patched build (etcd_package_version's default, "
            "scripts/build-etcd) or etcd 3.6.14, or accept with etcd_accepted_advisories")
    elif hit:
        detail += " (one tenant: no other tenant to reach)"
    return {"name": name, "ok": not (hit and shared) and bool(version), "detail": detail}
