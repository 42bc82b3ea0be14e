//! Upstream's Go host-local (/usr/lib/cni/host-local, Debian containernetworking-plugins
//! 1.1.1) and ours on the same dataDir: each must see, respect and delete what the other wrote.

use cni_tests::{bin, dir_state, reservations, result_ips, upstream_bin, Exec, Netns, PodNetns, TempDir};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Our binary's path, resolved once per test.
fn ours() -> String {
    bin("host-local").to_string_lossy().into_owned()
}

fn upstream() -> String {
    upstream_bin("host-local").to_string_lossy().into_owned()
}

/// One call of `bin` (a path) for an attachment of container `id` (ifname eth0).
fn call(bin: &str, command: &str, id: &str, ns: &Netns) -> Exec<'static> {
    Exec::new(bin)
        .env("CNI_COMMAND", command)
        .env("CNI_PATH", "/usr/lib/cni")
        .env("CNI_CONTAINERID", id)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_NETNS", ns.path_str())
}

fn conf(d: &Path) -> Value {
    // 1.0.0: the newest version upstream 1.1.1 speaks.
    json!({"cniVersion": "1.0.0", "name": "shared", "type": "bridge", "ipam": {
        "type": "host-local", "dataDir": d,
        "ranges": [[{"subnet": "10.20.0.0/24"}], [{"subnet": "fd20::/64"}]]
    }})
}

fn name(bin: &str) -> &'static str {
    if bin == ours() {
        "ours"
    } else {
        "upstream"
    }
}

/// Reservations by id: what the store must hold.
fn by_owner(net: &Path) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (ip, content) in reservations(net) {
        m.entry(content).or_default().push(ip);
    }
    m
}

#[test]
fn alternating_add_and_del_share_the_store_both_ways() {
    let up = upstream();
    let ns = Netns::new("hlu");
    let d = TempDir::new("hlu");
    let c = conf(d.path());
    let net = d.path().join("shared");
    let mut model: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut next = (2u32, 2u32); // round-robin position, shared through last_reserved_ip.N
    let mut live: Vec<String> = Vec::new();
    for step in 0..24 {
        let ours = ours();
        let bin = if step % 2 == 0 { up.as_str() } else { ours.as_str() };
        if step % 3 == 2 {
            // DEL the oldest attachment: it was always ADDed by the other binary or by this
            // one two rounds ago; over 24 steps both directions occur many times.
            let id = live.remove(0);
            call(bin, "DEL", &id, &ns).run_json(&c).success();
            model.remove(&format!("{id}\r\neth0"));
        } else {
            let id = format!("{}-{step}", name(bin));
            let out = call(bin, "ADD", &id, &ns).run_json(&c).success();
            let want = vec![format!("10.20.0.{}", next.0), format!("fd20::{:x}", next.1)];
            assert_eq!(result_ips(&out.json()), want, "step {step} ({})", name(bin));
            next = (next.0 + 1, next.1 + 1);
            let mut ips = want.clone();
            ips.sort();
            model.insert(format!("{id}\r\neth0"), ips);
            live.push(id);
        }
        assert_eq!(by_owner(&net), model, "after step {step} ({})", name(bin));
    }
    // Each binary DELs what the other ADDed, in both directions, for what is left.
    for id in live.clone() {
        let ours = ours();
        let bin = if id.starts_with("ours") { up.as_str() } else { ours.as_str() };
        call(bin, "DEL", &id, &ns).run_json(&c).success();
    }
    assert!(reservations(&net).is_empty(), "{:?}", reservations(&net));
}

#[test]
fn duplicate_checks_and_check_see_the_other_binarys_reservations() {
    let up = upstream();
    let ns = Netns::new("hlu");
    let d = TempDir::new("hlu");
    let c = conf(d.path());
    let theirs = call(&up, "ADD", "theirs", &ns).run_json(&c).success();
    let mine = call(&ours(), "ADD", "ours", &ns).run_json(&c).success();
    call(&ours(), "ADD", "theirs", &ns).run_json(&c).err_with(999, "duplicate allocation is not allowed");
    let up_dup = call(&up, "ADD", "ours", &ns).run_json(&c);
    assert!(
        up_dup.code != 0 && up_dup.stdout.contains("duplicate allocation is not allowed"),
        "{}",
        up_dup.stdout
    );
    // CHECK across binaries (upstream only checks existence; ours also compares prevResult)
    let mut chk = c.clone();
    chk["prevResult"] = theirs.json();
    call(&ours(), "CHECK", "theirs", &ns).run_json(&chk).success();
    chk["prevResult"] = mine.json();
    call(&up, "CHECK", "ours", &ns).run_json(&chk).success();
    // a requested address held by the other binary is refused by both
    let mut req = c.clone();
    req["args"] = json!({"cni": {"ips": [result_ips(&theirs.json())[0]]}});
    call(&ours(), "ADD", "x", &ns).run_json(&req).err_with(999, "is not available in range set");
    req["args"] = json!({"cni": {"ips": [result_ips(&mine.json())[0]]}});
    let up_req = call(&up, "ADD", "y", &ns).run_json(&req);
    assert!(up_req.code != 0 && up_req.stdout.contains("is not available"), "{}", up_req.stdout);
}

#[test]
fn upstream_never_mistakes_our_index_for_a_reservation() {
    let up = upstream();
    let ns = Netns::new("hlu");
    let d = TempDir::new("hlu");
    let c = conf(d.path());
    let net = d.path().join("shared");
    for i in 0..5 {
        call(&ours(), "ADD", &format!("c{i}"), &ns).run_json(&c).success();
    }
    assert!(net.join(".host-local-index").exists());
    // upstream DEL walks the directory and reads every file, ours included
    for i in 0..5 {
        call(&up, "DEL", &format!("c{i}"), &ns).run_json(&c).success();
    }
    assert!(reservations(&net).is_empty());
    assert!(net.join(".host-local-index").exists(), "upstream left the index alone");
    let names: Vec<String> =
        std::fs::read_dir(&net).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names.len(), 5, "lock, 2 cursors, index, netns records: {names:?}");
    // and ours, after upstream changed everything behind its back, agrees
    let again = call(&ours(), "ADD", "c0", &ns).run_json(&c).success();
    assert_eq!(result_ips(&again.json()), ["10.20.0.7", "fd20::7"], "round-robin continues");
}

/// One call of `bin` for container `id` whose namespace is at `netns`.
fn call_at(bin: &str, command: &str, id: &str, netns: &str) -> Exec<'static> {
    Exec::new(bin)
        .env("CNI_COMMAND", command)
        .env("CNI_PATH", "/usr/lib/cni")
        .env("CNI_CONTAINERID", id)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_NETNS", netns)
}

/// Issue 21: a small pool filled completely by pods in their own namespaces and one
/// reservation Debian's host-local made; two namespaces deleted without DEL, a third deleted
/// and another created under its name. The next ADD gets a dead pod's address; every other
/// file of the store (the whole directory, records included) stays byte for byte; a late DEL of a reclaimed attachment frees nothing; upstream's
/// binary keeps working on the store.
#[test]
fn an_exhausted_pool_takes_back_only_what_is_provably_dead() {
    let up = upstream();
    let ours = ours();
    let d = TempDir::new("hlu");
    let c = json!({"cniVersion": "1.0.0", "name": "small", "type": "bridge", "ipam": {
        "type": "host-local", "dataDir": d.path(), "ranges": [[{"subnet": "10.21.0.0/29"}]]
    }}); // .2 … .6
    let net = d.path().join("small");
    let debian = PodNetns::new("hlud");
    let made = call_at(&up, "ADD", "debian", debian.path()).run_json(&c).success();
    assert_eq!(result_ips(&made.json()), ["10.21.0.2"]);
    let pods: Vec<PodNetns> = (0..4).map(|_| PodNetns::new("hlup")).collect();
    for (i, p) in pods.iter().enumerate() {
        let out = call_at(&ours, "ADD", &format!("pod{i}"), p.path()).run_json(&c).success();
        assert_eq!(result_ips(&out.json()), [format!("10.21.0.{}", i + 3)]);
    }
    // Full, and nothing is dead: ADD fails and changes nothing.
    let full = dir_state(d.path());
    let waiting = PodNetns::new("hlun");
    call_at(&ours, "ADD", "new", waiting.path()).run_json(&c).err_with(999, "no IP addresses available");
    assert_eq!(dir_state(d.path()), full);

    let mut it = pods.into_iter();
    let (p0, p1, p2, p3) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    let (p0_path, p2_name) = (p0.path().to_string(), p2.name().to_string());
    p0.delete();
    p1.delete();
    p2.delete();
    let _p2_successor = PodNetns::named(&p2_name);
    // Debian's pod dies too: its reservation has no record, so it counts as live.
    debian.delete();
    // The whole store, names and bytes, the records' directory included, before the
    // reclaiming ADD: afterwards only what that ADD must change may differ.
    let before: BTreeMap<String, Vec<u8>> = dir_state(d.path()).into_iter().collect();
    assert_eq!(before, full.iter().cloned().collect(), "deleting namespaces changes no file");
    assert!(before.contains_key("small/.host-local-ns/10.21.0.6"), "the snapshot holds the records");
    let released = ["10.21.0.3", "10.21.0.4", "10.21.0.5"];

    let out = call_at(&ours, "ADD", "new", waiting.path()).run_json(&c).success();
    let got = result_ips(&out.json())[0].clone();
    assert!(released.contains(&got.as_str()), "{got}");
    for (ip, id, why) in [
        ("10.21.0.3", "pod0", "no longer exists"),
        ("10.21.0.4", "pod1", "no longer exists"),
        ("10.21.0.5", "pod2", "is another namespace now"),
    ] {
        let line = format!("network small: the pool is exhausted: released {ip} of container {id} interface eth0: its network namespace");
        assert!(out.stderr.lines().any(|l| l.contains(&line) && l.contains(why)), "{id}: {}", out.stderr);
    }
    let after: BTreeMap<String, Vec<u8>> = dir_state(d.path()).into_iter().collect();
    // What the ADD may change: the released reservations and their records (removed, or one
    // replaced by the new pod's), the cursor and the index. Everything else, byte for byte:
    // Debian's reservation, pod3's reservation and record, the boot marker, the lock, the
    // directories and their modes, and no file added.
    let may_change = |n: &str| {
        n == "small/last_reserved_ip.0"
            || n == "small/.host-local-index"
            || released
                .iter()
                .any(|ip| n == format!("small/{ip}") || n == format!("small/.host-local-ns/{ip}"))
    };
    let rest = |m: &BTreeMap<String, Vec<u8>>| {
        m.iter().filter(|(n, _)| !may_change(n)).map(|(n, b)| (n.clone(), b.clone())).collect::<Vec<_>>()
    };
    assert_eq!(rest(&after), rest(&before), "every other file of the store stays byte for byte");
    for n in [
        "small/10.21.0.2",
        "small/10.21.0.6",
        "small/.host-local-ns/10.21.0.6",
        "small/.host-local-ns/boot",
        "small/lock",
        "small/.host-local-ns/",
    ] {
        assert!(after.contains_key(n), "{n} is among the files compared");
    }
    // ... and what changed, changed exactly so.
    for ip in released {
        let (file, record) = (format!("small/{ip}"), format!("small/.host-local-ns/{ip}"));
        assert!(
            before.contains_key(&file) && before.contains_key(&record),
            "{ip}: a reservation and its record"
        );
        if ip == got {
            assert_eq!(after[&file], b"new\r\neth0", "{ip}: the new pod's reservation");
            let text = String::from_utf8(after[&record].clone()).unwrap();
            assert!(
                text.starts_with("cni-rs host-local netns record v1\n") && text.contains(waiting.path()),
                "{ip}: the new pod's record: {text}"
            );
            assert_ne!(after[&record], before[&record], "{ip}: the dead pod's record is replaced");
        } else {
            assert!(!after.contains_key(&file), "{ip}: released");
            assert!(!after.contains_key(&record), "{ip}: its record removed with it");
        }
    }
    assert_eq!(after["small/last_reserved_ip.0"], got.as_bytes(), "the cursor");
    assert!(after.contains_key("small/.host-local-index"), "the index");
    let mut want = vec![
        format!("{got}=new\r\neth0"),
        "10.21.0.2=debian\r\neth0".into(),
        "10.21.0.6=pod3\r\neth0".into(),
    ];
    want.sort();
    let left: Vec<String> = reservations(&net).into_iter().map(|(ip, c)| format!("{ip}={c}")).collect();
    assert_eq!(left, want);

    // The late DEL of a reclaimed pod frees nothing that a pod holds now.
    let before = dir_state(d.path());
    call_at(&ours, "DEL", "pod0", &p0_path).run_json(&c).success();
    assert_eq!(dir_state(d.path()), before);
    // Upstream's binary on the same store: CHECK and DEL of our pods, ADD of its own.
    call_at(&up, "CHECK", "pod3", p3.path()).run_json(&c).success();
    call_at(&up, "DEL", "new", "").run_json(&c).success();
    let again = PodNetns::new("hlua");
    call_at(&up, "ADD", "up2", again.path()).run_json(&c).success();
    call_at(&ours, "DEL", "debian", "").run_json(&c).success();
    call_at(&up, "DEL", "pod3", "").run_json(&c).success();
    call_at(&ours, "DEL", "up2", again.path()).run_json(&c).success();
    assert!(reservations(&net).is_empty(), "{:?}", reservations(&net));
}
