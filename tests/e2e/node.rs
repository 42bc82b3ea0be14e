//! The scratch node the runtime tests run their daemons in (`cni_tests::node::Node`, issue 35):
//! what runs through it is in the node's network, mount and UTS namespaces and cgroups, its
//! fixed paths (`/run`, the CNI directories, the runtimes' state directories) are its own, two
//! nodes side by side each have the whole port space (the kubelet's 10250 in both), and what a
//! test leaves running in a node ends with it. Nothing here looks at the machine's links or
//! rules: only at the node, and at the identities of namespaces and cgroups.

use cni_tests::node::{Node, SCRATCH_PATHS};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// Read one line from a child's stdout (what it prints once it is ready).
fn first_line(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().expect("piped stdout")).read_line(&mut line).expect("read");
    line.trim().to_string()
}

#[test]
fn node_runs_its_processes_in_its_own_namespaces_cgroups_and_paths() {
    let node = Node::new("ndt");
    // UTS: its own hostname, the machine's untouched
    let machine_hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(node.hostname(), node.name);
    assert_eq!(std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(), machine_hostname);

    // a process started in the node is confined to it; the test process is not
    let mut sleeper = node
        .enter("sh")
        .args(["-c", "echo ready; exec sleep 600"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn in the node");
    assert_eq!(first_line(&mut sleeper), "ready");
    let pid = sleeper.id() as i32;
    // nsenter execs sh, which execs sleep (after its echo): the child is the sleeper itself
    cni_tests::wait_until("sh to exec sleep", Duration::from_secs(10), || {
        !node.pids_named("sleep").is_empty()
    });
    assert_eq!(node.pids_named("sleep"), vec![pid]);
    node.confines(pid).unwrap_or_else(|e| panic!("{e}"));
    node.assert_confined("sleep");
    let me = std::process::id() as i32;
    assert!(node.confines(me).is_err(), "the test process counted as confined: the check checks nothing");

    // cgroups: a cgroup namespace rooted at the node's cgroups, every hierarchy mounted again
    // in it, so a cgroup a runtime makes at "/" (runc's /k8s.io/<id>) is below the node's
    let seen = node.must("cat", &["/proc/self/cgroup"]);
    assert!(
        seen.lines().all(|l| l.ends_with(":/")),
        "the node's processes see the machine's cgroup tree: {seen}"
    );
    let pids_dir = node.cgroup_dirs().into_iter().find(|d| d.starts_with("/sys/fs/cgroup/pids"));
    if let Some(dir) = pids_dir {
        node.must("mkdir", &["/sys/fs/cgroup/pids/nodens-pod"]);
        assert!(
            dir.join("nodens-pod").is_dir(),
            "a cgroup made at the node's / is not below {}",
            dir.display()
        );
    }

    // network: a link made in the node is the node's (seen through its namespace)
    node.must("ip", &["link", "add", "nodens-a", "type", "veth", "peer", "name", "nodens-b"]);
    let links = node.host.link_names();
    assert!(links.contains(&"nodens-a".to_string()) && links.contains(&"nodens-b".to_string()), "{links:?}");
    assert!(node.host.link_is_up("lo"), "the node's loopback is up");

    // mounts: /run is the node's own tmpfs (a file made there is not in the machine's /run),
    // and each fixed path shows its scratch directory
    let marker = format!("/run/{}-marker", node.name);
    node.must("touch", &[&marker]);
    assert!(!Path::new(&marker).exists(), "{marker} reached the machine's /run");
    node.must("ls", &["/run/netns"]);
    for (name, path) in SCRATCH_PATHS {
        let file = format!("{}-{name}", node.name);
        std::fs::write(node.dir.join(name).join(&file), name).unwrap();
        let seen = node.must("cat", &[&format!("{path}/{file}")]);
        assert_eq!(seen, name, "{path} in the node is not its scratch {name}");
        assert!(!Path::new(path).join(&file).exists(), "{path}/{file} reached the machine");
    }

    // what is still running when the node goes is ended with it, and its cgroups removed
    let cgroups: Vec<String> =
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap().lines().map(str::to_string).collect();
    assert!(cgroups.iter().any(|l| l.ends_with(&format!("/{}", node.name))), "{cgroups:?}");
    drop(node);
    let status = sleeper.wait().expect("reap the sleeper");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "the sleeper outlived its node: {status:?}");
}

/// Two nodes each bind the kubelet's port 10250 and the same node-local address: every node
/// has its own port space, so two copies of a runtime test (two kubelets) never collide.
#[test]
fn two_nodes_bind_the_same_port_side_by_side() {
    let nodes = [Node::new("ndp"), Node::new("ndp")];
    assert_ne!(nodes[0].name, nodes[1].name);
    let mut servers = Vec::new();
    for n in &nodes {
        let reply = format!("SYSTEM:echo {}", n.name);
        let mut s = n
            .enter("socat")
            .args(["-d", "-d", "TCP-LISTEN:10250,bind=127.0.0.1,reuseaddr,fork", &reply])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn socat in the node");
        // socat says "listening on" (stderr, -d -d) once bound
        let mut err = std::io::BufReader::new(s.stderr.take().unwrap());
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            let n = std::io::BufRead::read_line(&mut err, &mut line).expect("read socat");
            assert!(n > 0, "socat ended before listening: {seen}");
            seen.push_str(&line);
            if line.contains("listening on") {
                break;
            }
        }
        servers.push((s, err));
    }
    for n in &nodes {
        let got = cni_tests::clients::wait_for("the node's own listener", Duration::from_secs(10), || {
            let out = n.command(10, "socat").args(["-T", "5", "-", "TCP:127.0.0.1:10250"]).output().ok()?;
            out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        });
        assert_eq!(got, n.name, "node {} reached another node's listener", n.name);
    }
    drop(nodes);
    for (mut s, _) in servers {
        assert_eq!(s.wait().expect("reap socat").signal(), Some(libc::SIGKILL));
    }
}

/// A directory below a path the node covers with a tmpfs (`/run` here; a checkout under /opt or
/// /run, the binaries, the peers, the scratch root: what every node keeps) stays reachable at
/// its own path in a node that keeps it, read and written through; a node that does not keep
/// it does not see it (so the first half shows the keeping, not an uncovered path).
#[test]
fn node_keeps_a_directory_below_a_path_it_covers() {
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Gone(Path::new("/run").join(cni_tests::unique("cni-keep")));
    std::fs::create_dir(&dir.0).unwrap();
    std::fs::write(dir.0.join("file"), "kept\n").unwrap();
    let file = dir.0.join("file");
    let file = file.to_str().unwrap();

    let covering = Node::new("ndk");
    let out = covering.command(10, "cat").arg(file).output().unwrap();
    assert!(!out.status.success(), "{file} visible under the node's /run without keeping it");
    drop(covering);

    let node = Node::keeping("ndk", &[&dir.0]);
    assert_eq!(node.must("cat", &[file]), "kept\n");
    node.must("sh", &["-c", &format!("echo back > {}/back", dir.0.display())]);
    assert_eq!(std::fs::read_to_string(dir.0.join("back")).unwrap(), "back\n");
    // the rest of /run is still the node's own
    assert!(node.command(10, "ls").arg("/run/netns").output().unwrap().status.success());
    let marker = format!("/run/{}-marker", node.name);
    node.must("touch", &[&marker]);
    assert!(!Path::new(&marker).exists(), "{marker} reached the machine's /run");
}
