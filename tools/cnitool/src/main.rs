//! The `cnitool` binary: `cnitool add|check|del|gc|status <net> <netns>`.

use cnitool::rt::{parse_command_line, Invocation};
use cnitool::runner::SystemExec;
use std::io::Write;
use std::process::ExitCode;

const USAGE: &str = "\
cnitool: add, check, remove, garbage-collect or query the status of network interfaces in a network namespace
  cnitool add    <net> <netns>
  cnitool check  <net> <netns>
  cnitool del    <net> <netns>
  cnitool gc     <net> <netns>
  cnitool status <net> <netns>

<net> is the `name` of a network configuration in NETCONFPATH (.conflist files first, then
legacy single-plugin .conf/.json files, each group in file-name order). <netns> is the path of
the network namespace, e.g. /var/run/netns/NAME. The container id is \"cnitool-\" followed by
the hex of the first 10 bytes of sha512(absolute <netns> path). ADD prints the result on
stdout and caches it in <cache dir>/results/<net>-<container id>-<ifname> (libcni's format);
CHECK and DEL use that cache. Errors go to stderr with exit status 1.

Environment (as upstream cnitool):
  NETCONFPATH   directory of network configurations (default /etc/cni/net.d)
  CNI_PATH      ':'-separated directories searched for plugin binaries
  CNI_IFNAME    interface name inside the namespace (default eth0)
  CNI_ARGS      K=V;K=V passed to the plugins as CNI_ARGS (every key and value non-empty)
  CAP_ARGS      JSON object of capability arguments, e.g. {\"portMappings\":[...]}; each plugin
                gets those it declares in `capabilities` as `runtimeConfig`

Extensions (not in upstream cnitool):
  CNI_CACHE_DIR    cache directory (default /var/lib/cni, as libcni)
  CNI_CONTAINERID  container id to use instead of the one derived from <netns>
  CNI_GC_KEEP      for gc: id:ifname,id:ifname attachments that stay valid. Default: none:
                   like upstream cnitool, gc deletes every cached attachment of <net>; unlike
                   libcni 1.3's, which then sends GC with no valid-attachments list (our
                   plugins refuse that, code 7), ours sends the list, empty by default
  CNI_CHILD_TIMEOUT_MS  deadline of each plugin run, in milliseconds (default 120000;
                   inherited by the plugins for their own delegates). Past it the plugin's
                   process group is killed and the verb fails with code 11
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(args.first().map(String::as_str), Some("-h" | "--help" | "help")) {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let (verb, net, netns) = match parse_command_line(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("cnitool: {}\n\n{USAGE}", e.0);
            return ExitCode::FAILURE;
        }
    };
    let inv = match Invocation::new(verb, net, &netns, |k| std::env::var(k).ok()) {
        Ok(inv) => inv,
        Err(e) => return fail(&e),
    };
    match cnitool::run(&inv, SystemExec) {
        Ok(Some(out)) => {
            let mut stdout = std::io::stdout().lock();
            if writeln!(stdout, "{out}").and_then(|_| stdout.flush()).is_err() {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &cni_common::CniError) -> ExitCode {
    if e.details.is_empty() {
        eprintln!("{}", e.msg);
    } else {
        eprintln!("{}; {}", e.msg, e.details);
    }
    ExitCode::FAILURE
}
