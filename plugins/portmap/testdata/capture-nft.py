#!/usr/bin/env python3
"""Regenerate nft-golden.txt: the nf_tables messages `nft` 1.0.6 sends for each case of
capture-cases.txt (which portmap's declaration writes: see layout/tests.rs), captured with
`strace -e write=<fd>` in a scratch network namespace by cni-common's capture script. Run as
root: `unshare -n python3 capture-nft.py > nft-golden.txt`. Each line is
`<name> <hex of one message>`."""
import importlib.util, pathlib

_here = pathlib.Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "capture_nft", _here / "../../../cni-common/src/netlink/nft/testdata/capture-nft.py")
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)

cases = []
for line in (_here / "capture-cases.txt").read_text().splitlines():
    name, setup, cmd = line.split("\t")
    cases.append((name, setup.replace("\\n", "\n"), cmd))
_common.capture(cases)
