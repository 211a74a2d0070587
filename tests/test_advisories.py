"""plugins/plugin_utils/sandbox_advisories.py (what is known against an etcd build: verify's
check, up's warning, status's line) and plugins/plugin_utils/sandbox_attacks.py (the
hostile-tenant suite's checks), on what `etcd --version` and the suite really print."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandboxlib import sandbox_advisories as adv
from sandboxlib import sandbox_attacks as attacks

# what `etcd --version` of scripts/build-etcd's build prints (its Git SHA line names each
# patch's "Fixes:" header, in the patches' order)
FIXES = ["etcd-io/etcd#22386", "GHSA-xg4h-6gfc-h4m8", "GHSA-6vch-q96h-7gc3", "etcd-io/etcd#22167",
         "etcd-io/etcd#22128", "k0sbox-lease-owners", "etcd-io/etcd#10084"]
PATCHED = ("etcd Version: 3.5.30\nGit SHA: 3.5.30-2+k0sbox2 (k0s-etcd-sandbox build of Debian "
           f"3.5.30-2, patched: {', '.join(FIXES)})\n"
           "Go Version: go1.27.3\nGo OS/Arch: linux/amd64\n")
# no etcd release fixes these two: every build but the sandbox's has them
UNFIXED = ["etcd-io/etcd#10084", "k0sbox-lease-owners"]
REPO = Path(__file__).resolve().parents[1]
DEBIAN = "etcd Version: 3.5.30\nGit SHA: Not provided (use ./build instead of go build)\n"


def ids(version: str, sha: str = "") -> list[str]:
    return [a["id"] for a in adv.affecting(version, sha)]


def test_each_version_is_affected_by_what_its_branch_has_not_fixed() -> None:
    assert ids("3.5.30") == ["etcd-io/etcd#22386", "GHSA-xg4h-6gfc-h4m8", "GHSA-6vch-q96h-7gc3",
                             "etcd-io/etcd#22167", "etcd-io/etcd#22128", *UNFIXED]
    assert len(ids("3.4.23")) == 11 and "GHSA-3p4g-rcw5-8298" in ids("3.4.23")
    assert len(ids("3.5.16")) == 10 and "GHSA-3p4g-rcw5-8298" not in ids("3.5.16")
    assert ids("3.5.33") == ["etcd-io/etcd#22386", *UNFIXED]        # never fixed on 3.5
    assert ids("3.6.14") == UNFIXED and ids("3.6.9") == [
        "GHSA-xg4h-6gfc-h4m8", "GHSA-x35m-3gp4-4fh5", "GHSA-6vch-q96h-7gc3", "etcd-io/etcd#22167",
        "etcd-io/etcd#22128", *UNFIXED]
    assert "etcd-io/etcd#22167" not in ids("3.6.14") and "etcd-io/etcd#22128" in ids("3.6.13")
    # a configuration the sandbox never sets is not counted
    states = {a["id"]: a["state"] for a in adv.assess("3.5.30")}
    assert states["GHSA-3wh4-j44w-pg92"] == "not-relevant"
    assert states["GHSA-q8m4-xhhv-38mg"] == "fixed" and states["GHSA-3p4g-rcw5-8298"] == "fixed"
    assert adv.assess("not a version") == []


def test_the_sandboxs_build_names_what_its_patches_fix() -> None:
    version, sha = adv.parse_version(PATCHED)
    assert version == "3.5.30" and adv.patched(sha) == FIXES
    assert ids(version, sha) == []
    assert adv.summary(version, sha).endswith("no known advisory (7 fixed by its patches)")
    # the patch list is read from the patches themselves, as scripts/build-etcd makes the line
    headers = [line.split(": ", 1)[1] for p in sorted((REPO / "scripts" / "etcd-patches").glob("*.patch"))
               for line in p.read_text().splitlines() if line.startswith("Fixes: ")]
    assert headers == FIXES
    # only the sandbox's own build is believed: another Git SHA naming patches is not
    assert adv.patched("deadbeef patched: etcd-io/etcd#22386") == []
    assert adv.parse_version(DEBIAN) == ("3.5.30", "Not provided (use ./build instead of go build)")


def test_verify_fails_with_tenants_unless_the_operator_accepts() -> None:
    c = adv.check(DEBIAN, "etcd-1", shared=True)
    assert not c["ok"] and "FAIL: tenants share this etcd" in c["detail"]
    assert "etcd-io/etcd#22386: while an alarm (NOSPACE)" in c["detail"]
    one = adv.check(DEBIAN, "etcd-1", shared=False)
    assert one["ok"] and "one tenant" in one["detail"]
    every = ["etcd-io/etcd#22386", "GHSA-xg4h-6gfc-h4m8", "CVE-2026-73500", "etcd-io/etcd#22167",
             "etcd-io/etcd#22128", *UNFIXED]   # an id or a CVE
    accepted = adv.check(DEBIAN, "etcd-1", shared=True, accepted=every)
    assert accepted["ok"] and accepted["detail"].endswith("all accepted by the operator")
    assert not adv.check(DEBIAN, "etcd-1", shared=True, accepted=every[:2])["ok"]
    # the 3.6.14 release: no CVE open, but one quota for all and leases without an owner
    release = "etcd Version: 3.6.14\nGit SHA: 1a2b3c4\n"
    c = adv.check(release, "etcd-1", shared=True)
    assert not c["ok"] and "etcd-io/etcd#10084: one space quota for the whole cluster" in c["detail"]
    assert adv.check(release, "etcd-1", shared=True, accepted=UNFIXED)["ok"]
    assert adv.check(PATCHED, "etcd-1", shared=True)["ok"]
    assert not adv.check("", "etcd-1", shared=True)["ok"]   # no version: not a pass


def _attempt(name: str, outcome: str) -> dict[str, Any]:
    return {"name": name, "target": "t", "outcome": outcome, "detail": "d"}


def test_the_suites_check_fails_on_a_success_an_error_or_a_fill_that_did_not_fill() -> None:
    ok = {"tenant": "a", "phases": [{"phase": "normal", "attempts": [
        _attempt("x", "refused"), _attempt("y", "allowed"), _attempt("z", "n/a")]}]}
    c = attacks.check(ok)
    assert c["ok"] and "normally: 1 attacks refused, 0 succeeded; 1 allowed by design" in c["detail"]
    bad = {"tenant": "a", "phases": [{"phase": "nospace", "attempts": [
        _attempt("disable auth", "succeeded"), _attempt("w", "error")]}]}
    c = attacks.check(bad)
    assert not c["ok"] and "1 succeeded (disable auth)" in c["detail"]
    assert "1 without an answer (w)" in c["detail"]
    assert not attacks.check({"tenant": "a", "phases": ok["phases"],
                              "fill": {"ok": False, "detail": "no NOSPACE"}})["ok"]
    assert not attacks.check({"tenant": "a", "phases": []})["ok"]   # no attempt made


def test_the_finish_check_wants_auth_on_the_keys_kept_and_a_healthy_cluster() -> None:
    good = {"auth": "on", "changed": {}, "kept": {"b": 2}, "healthy": True, "alarms": ""}
    assert attacks.finish_check(good)["ok"]
    for change in ({"auth": "off"}, {"changed": {"b": ["/b/x deleted"]}}, {"healthy": False},
                   {"alarms": "memberID:1 alarm:NOSPACE"}):
        c = attacks.finish_check({**good, **change})
        assert not c["ok"], change
    assert "CHANGED: b: /b/x deleted" in attacks.finish_check(
        {**good, "changed": {"b": ["/b/x deleted"]}})["detail"]
