//! `cni-migrate`: the host state of running attachments, node-wide, in the network namespace
//! it runs in.
//!
//! ```text
//! cni-migrate to-upstream   [--dry-run] [--cache-dir DIR]... [--data-dir DIR]... [--backend iptables|nftables]
//! cni-migrate from-upstream [--dry-run] [--cache-dir DIR]... [--data-dir DIR]... [--cni-bin-dir DIR]
//! cni-migrate resync        [--dry-run] [--cache-dir DIR]... [--cni-bin-dir DIR]
//! cni-migrate doctor        [--json] [--bin-dir DIR]... [--conf-dir DIR] [--data-dir DIR]... [--cache-dir DIR]...
//! ```
//!
//! `to-upstream` and `from-upstream` move it between this suite's nftables layout and the
//! iptables form of upstream's plugins (1.1.1, Debian's, and the iptables backend of later
//! releases); `to-upstream` also writes the nftables backend's form of v1.6+ (v1.10.0 today:
//! `--backend nftables`, or an attachment's cached `backend`/`ipMasqBackend` keys, see
//! to_upstream.rs); `scripts/migrate.sh` runs them and
//! docs/switching.md explains when. Both are idempotent and keep every attachment's traffic
//! flowing: the new form is installed and verified before the old one is removed. Exit status
//! 0 when everything was converted (or nothing needed to be), 1 when something could not be
//! (the old form of what failed is kept), 2 for bad usage or a node that cannot do it (no root,
//! no iptables: nothing changed).
//!
//! `resync` rebuilds what a firewall reload took from every live attachment in libcni's cache
//! (`resync.rs`; `scripts/migrate.sh resync` and the systemd unit `scripts/systemd/cni-resync.service`
//! run it; docs/node-operations.md). Exit status 0 when everything was intact (nothing was
//! changed), 10 when something was rebuilt (with `--dry-run`: would be), 1 when some
//! attachment, or some plugin's part of one, could not be judged or rebuilt (the others
//! were; each is named, again at the end as `not judged: …`), 2 when it refused before
//! looking (bad usage, no root, another resync holding the lock): nothing changed.
//!
//! `doctor` changes nothing: a report of the node (its binaries, conflists, our and upstream's
//! state, the kernel's path for pod traffic) with what to do about each finding (`doctor.rs`;
//! docs/node-operations.md). Exit status 0 when healthy, 1 with findings, 2 when it could not
//! run.

mod doctor;
mod from_upstream;
mod installed;
mod inventory;
mod opts;
mod ours;
mod resync;
mod to_upstream;

use std::path::PathBuf;

use opts::{Opts, Report};

const USAGE: &str = "usage: cni-migrate to-upstream|from-upstream|resync [--dry-run] [--cache-dir DIR]... \
                     [--data-dir DIR]... [--cni-bin-dir DIR] [--backend iptables|nftables (to-upstream)]\n       \
                     cni-migrate doctor [--json] [--bin-dir DIR]... [--conf-dir DIR] [--data-dir DIR]... [--cache-dir DIR]...";

/// The commands.
const COMMANDS: [&str; 3] = ["to-upstream", "from-upstream", "resync"];

fn default_bin_dir() -> PathBuf {
    // next to this binary when our plugins are there (install.sh puts it with them)
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.to_path_buf()))
        .filter(|d| d.join("portmap").is_file())
        .unwrap_or_else(|| PathBuf::from("/opt/cni/bin"))
}

fn parse(args: &[String]) -> Result<(String, Opts), String> {
    let mut it = args.iter();
    let cmd = it.next().ok_or(USAGE)?.clone();
    if !COMMANDS.contains(&cmd.as_str()) {
        return Err(format!("unknown command {cmd:?}\n{USAGE}"));
    }
    let mut o = Opts {
        dry_run: false,
        cache_dirs: Vec::new(),
        data_dirs: Vec::new(),
        bin_dir: default_bin_dir(),
        nftables: false,
    };
    while let Some(a) = it.next() {
        let mut value = || it.next().map(PathBuf::from).ok_or(format!("{a} needs a value\n{USAGE}"));
        match a.as_str() {
            "--dry-run" => o.dry_run = true,
            "--cache-dir" => o.cache_dirs.push(value()?),
            "--data-dir" => o.data_dirs.push(value()?),
            "--cni-bin-dir" => o.bin_dir = value()?,
            "--backend" if cmd == "to-upstream" => match value()?.to_str() {
                Some("iptables") => o.nftables = false,
                Some("nftables") => o.nftables = true,
                _ => return Err(format!("--backend takes iptables or nftables\n{USAGE}")),
            },
            _ => return Err(format!("unknown argument {a:?}\n{USAGE}")),
        }
    }
    if o.cache_dirs.is_empty() {
        o.cache_dirs.push(PathBuf::from("/var/lib/cni"));
    }
    if o.data_dirs.is_empty() {
        o.data_dirs.push(PathBuf::from("/var/lib/cni/networks"));
    }
    Ok((cmd, o))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return;
    }
    if args.first().is_some_and(|a| a == "doctor") {
        doctor_main(&args[1..]);
    }
    let (cmd, opts) = match parse(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("cni-migrate must run as root (it reads and changes the firewall); nothing was changed");
        std::process::exit(2);
    }
    if cmd == "resync" {
        resync_main(&opts);
    }
    let mut report = Report::default();
    let r = if cmd == "to-upstream" {
        to_upstream::run(&opts, &mut report)
    } else {
        from_upstream::run(&opts, &mut report)
    };
    for n in &report.notes {
        println!("note: {n}");
    }
    for d in &report.done {
        println!("{}{d}", if opts.dry_run { "" } else { "converted: " });
    }
    match r {
        Ok(()) => println!("{cmd}: done{}", if opts.dry_run { " (dry run: nothing changed)" } else { "" }),
        Err(e) => {
            eprintln!("{cmd}: {}", e.msg);
            if !e.details.is_empty() {
                eprintln!("{}", e.details);
            }
            // Refusals before anything changed are usage-level (2); the rest is 1.
            std::process::exit(if e.code == cni_common::code::NOT_AVAILABLE { 2 } else { 1 });
        }
    }
}

/// `doctor`: the report (text, or one JSON document with `--json`), the exit status of the
/// module docs.
fn doctor_main(args: &[String]) -> ! {
    let o = match doctor::parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("cni-migrate doctor must run as root (it reads the firewall); nothing was changed");
        std::process::exit(2);
    }
    let r = doctor::run(&o);
    if o.json {
        println!("{}", r.to_json());
    } else {
        print!("{}", r.to_text());
    }
    std::process::exit(if r.findings.is_empty() { 0 } else { 1 })
}

/// `resync`: its lines as it goes, a summary, the exit status of the module docs.
fn resync_main(opts: &Opts) -> ! {
    match resync::run(&opts.cache_dirs, &opts.bin_dir, opts.dry_run) {
        Ok(t) => {
            // what could not be judged, named again at the end: never an "all is well"
            for n in &t.not_judged {
                println!("not judged: {n}");
            }
            println!(
                "resync: {} attachment(s): {} {}, {} intact, {} with nothing of ours to rebuild, {} skipped \
                 (pod gone), {} failed, {} not judged{}",
                t.repaired + t.intact + t.nothing + t.skipped + t.failed + t.unjudged,
                t.repaired,
                if opts.dry_run { "to repair" } else { "repaired" },
                t.intact,
                t.nothing,
                t.skipped,
                t.failed,
                t.unjudged,
                if opts.dry_run { " (dry run: nothing changed)" } else { "" }
            );
            std::process::exit(if t.failed > 0 || t.unjudged > 0 {
                1
            } else if t.repaired > 0 {
                10
            } else {
                0
            })
        }
        Err(e) => {
            eprintln!("resync: {}", e.msg);
            std::process::exit(if e.code == cni_common::code::NOT_AVAILABLE { 2 } else { 1 });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments() {
        let a = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let (c, o) = parse(&a("to-upstream --dry-run --cache-dir /c --data-dir /d --data-dir /e")).unwrap();
        assert_eq!(c, "to-upstream");
        assert!(o.dry_run);
        assert_eq!(o.cache_dirs, vec![PathBuf::from("/c")]);
        assert_eq!(o.data_dirs.len(), 2);
        let (_, o) = parse(&a("from-upstream --cni-bin-dir /b")).unwrap();
        assert_eq!(o.bin_dir, PathBuf::from("/b"));
        assert_eq!(o.cache_dirs, vec![PathBuf::from("/var/lib/cni")]);
        let (c, o) = parse(&a("resync --dry-run --cache-dir /c --cni-bin-dir /b")).unwrap();
        assert_eq!((c.as_str(), o.dry_run, o.bin_dir), ("resync", true, PathBuf::from("/b")));
        assert!(!parse(&a("to-upstream")).unwrap().1.nftables);
        assert!(parse(&a("to-upstream --backend nftables")).unwrap().1.nftables);
        assert!(!parse(&a("to-upstream --backend iptables")).unwrap().1.nftables);
        assert!(parse(&a("to-upstream --backend ebpf")).is_err());
        assert!(parse(&a("from-upstream --backend nftables")).is_err(), "to-upstream's option only");
        assert!(parse(&a("sideways")).is_err());
        assert!(parse(&a("to-upstream --cache-dir")).is_err());
        assert!(parse(&[]).is_err());
    }
}
