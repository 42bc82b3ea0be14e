//! The Kubernetes path, kubelet → CRI → CNI, without a kubelet: a small CRI client that talks
//! `runtime.v1` to containerd's CRI plugin, a locally built image to serve as the pod sandbox
//! ("pause") and workload image, and a recorder that logs what the runtime hands to each
//! plugin. Used by `tests/e2e/cri.rs`; see docs/real-clients.md.
//!
//! **The client.** gRPC is HTTP/2 with one length-prefixed protobuf message each way and the
//! status in the trailers. [`CriClient`] does exactly that with `h2` over the daemon's unix
//! socket (a current-thread tokio runtime, one call at a time, every call under a timeout), and
//! the messages in [`pb`] are written by hand with `prost`'s derive: only the RPCs and fields the
//! test uses, field numbers from the CRI API's `pkg/apis/runtime/v1/api.proto` at k8s.io/cri-api
//! v0.25.0, the version containerd 1.6.20 builds against. Unknown fields in answers are skipped
//! by protobuf's rules, so the subset is safe.
//!
//! **The image.** [`build_image_archive`] packs a directory (busybox-static rootfs) into a
//! `docker save`-style archive, which `ctr -n k8s.io images import` loads; nothing is pulled.
//!
//! **The recorder.** [`install_recorders`] puts, for each plugin named, a shell wrapper into the
//! runtime's CNI bin dir that saves the `CNI_*` environment, stdin, stdout and exit code of the
//! call and runs the real plugin in between. [`recorded`] reads the calls back.

use crate::clients::must;
use bytes::{Buf, Bytes};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// CRI `runtime.v1` messages, the subset the test uses (field numbers from api.proto, cri-api
/// v0.25.0). Maps are `HashMap<String, String>`; enums are plain `i32`.
pub mod pb {
    use std::collections::HashMap;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct VersionRequest {
        #[prost(string, tag = "1")]
        pub version: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct VersionResponse {
        #[prost(string, tag = "1")]
        pub version: String,
        #[prost(string, tag = "2")]
        pub runtime_name: String,
        #[prost(string, tag = "3")]
        pub runtime_version: String,
        #[prost(string, tag = "4")]
        pub runtime_api_version: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StatusRequest {
        #[prost(bool, tag = "1")]
        pub verbose: bool,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RuntimeCondition {
        #[prost(string, tag = "1")]
        pub r#type: String,
        #[prost(bool, tag = "2")]
        pub status: bool,
        #[prost(string, tag = "3")]
        pub reason: String,
        #[prost(string, tag = "4")]
        pub message: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RuntimeStatus {
        #[prost(message, repeated, tag = "1")]
        pub conditions: Vec<RuntimeCondition>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StatusResponse {
        #[prost(message, optional, tag = "1")]
        pub status: Option<RuntimeStatus>,
    }

    /// `Protocol` enum: TCP = 0, UDP = 1, SCTP = 2.
    pub const PROTOCOL_TCP: i32 = 0;
    pub const PROTOCOL_UDP: i32 = 1;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PortMapping {
        #[prost(int32, tag = "1")]
        pub protocol: i32,
        #[prost(int32, tag = "2")]
        pub container_port: i32,
        #[prost(int32, tag = "3")]
        pub host_port: i32,
        #[prost(string, tag = "4")]
        pub host_ip: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxMetadata {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub uid: String,
        #[prost(string, tag = "3")]
        pub namespace: String,
        #[prost(uint32, tag = "4")]
        pub attempt: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LinuxPodSandboxConfig {
        #[prost(string, tag = "1")]
        pub cgroup_parent: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxConfig {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<PodSandboxMetadata>,
        #[prost(string, tag = "2")]
        pub hostname: String,
        #[prost(string, tag = "3")]
        pub log_directory: String,
        #[prost(message, repeated, tag = "5")]
        pub port_mappings: Vec<PortMapping>,
        #[prost(map = "string, string", tag = "6")]
        pub labels: HashMap<String, String>,
        #[prost(map = "string, string", tag = "7")]
        pub annotations: HashMap<String, String>,
        #[prost(message, optional, tag = "8")]
        pub linux: Option<LinuxPodSandboxConfig>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunPodSandboxRequest {
        #[prost(message, optional, tag = "1")]
        pub config: Option<PodSandboxConfig>,
        #[prost(string, tag = "2")]
        pub runtime_handler: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunPodSandboxResponse {
        #[prost(string, tag = "1")]
        pub pod_sandbox_id: String,
    }

    /// Request of StopPodSandbox, RemovePodSandbox (same shape: the sandbox id, field 1).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxIdRequest {
        #[prost(string, tag = "1")]
        pub pod_sandbox_id: String,
    }
    /// The empty responses (StopPodSandbox, RemovePodSandbox, StartContainer, …).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Empty {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxStatusRequest {
        #[prost(string, tag = "1")]
        pub pod_sandbox_id: String,
        #[prost(bool, tag = "2")]
        pub verbose: bool,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodIp {
        #[prost(string, tag = "1")]
        pub ip: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxNetworkStatus {
        #[prost(string, tag = "1")]
        pub ip: String,
        #[prost(message, repeated, tag = "2")]
        pub additional_ips: Vec<PodIp>,
    }
    /// `PodSandboxState` enum: SANDBOX_READY = 0, SANDBOX_NOTREADY = 1.
    pub const SANDBOX_READY: i32 = 0;
    pub const SANDBOX_NOTREADY: i32 = 1;
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxStatus {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(message, optional, tag = "2")]
        pub metadata: Option<PodSandboxMetadata>,
        #[prost(int32, tag = "3")]
        pub state: i32,
        #[prost(int64, tag = "4")]
        pub created_at: i64,
        #[prost(message, optional, tag = "5")]
        pub network: Option<PodSandboxNetworkStatus>,
        #[prost(map = "string, string", tag = "8")]
        pub annotations: HashMap<String, String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxStatusResponse {
        #[prost(message, optional, tag = "1")]
        pub status: Option<PodSandboxStatus>,
        /// With `verbose`: JSON documents, containerd puts its sandbox record under "info".
        #[prost(map = "string, string", tag = "2")]
        pub info: HashMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxRequest {}
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandbox {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(message, optional, tag = "2")]
        pub metadata: Option<PodSandboxMetadata>,
        #[prost(int32, tag = "3")]
        pub state: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxResponse {
        #[prost(message, repeated, tag = "1")]
        pub items: Vec<PodSandbox>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ImageSpec {
        #[prost(string, tag = "1")]
        pub image: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerMetadata {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(uint32, tag = "2")]
        pub attempt: u32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerConfig {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ContainerMetadata>,
        #[prost(message, optional, tag = "2")]
        pub image: Option<ImageSpec>,
        #[prost(string, repeated, tag = "3")]
        pub command: Vec<String>,
        #[prost(string, repeated, tag = "4")]
        pub args: Vec<String>,
        #[prost(string, tag = "11")]
        pub log_path: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateContainerRequest {
        #[prost(string, tag = "1")]
        pub pod_sandbox_id: String,
        #[prost(message, optional, tag = "2")]
        pub config: Option<ContainerConfig>,
        #[prost(message, optional, tag = "3")]
        pub sandbox_config: Option<PodSandboxConfig>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateContainerResponse {
        #[prost(string, tag = "1")]
        pub container_id: String,
    }
    /// Request of StartContainer, RemoveContainer (the container id, field 1).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerIdRequest {
        #[prost(string, tag = "1")]
        pub container_id: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StopContainerRequest {
        #[prost(string, tag = "1")]
        pub container_id: String,
        #[prost(int64, tag = "2")]
        pub timeout: i64,
    }
    /// `ContainerState` enum: CREATED = 0, RUNNING = 1, EXITED = 2, UNKNOWN = 3.
    pub const CONTAINER_RUNNING: i32 = 1;
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerStatusRequest {
        #[prost(string, tag = "1")]
        pub container_id: String,
        #[prost(bool, tag = "2")]
        pub verbose: bool,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerStatus {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(int32, tag = "3")]
        pub state: i32,
        #[prost(int32, tag = "7")]
        pub exit_code: i32,
        #[prost(string, tag = "10")]
        pub reason: String,
        #[prost(string, tag = "11")]
        pub message: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerStatusResponse {
        #[prost(message, optional, tag = "1")]
        pub status: Option<ContainerStatus>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExecSyncRequest {
        #[prost(string, tag = "1")]
        pub container_id: String,
        #[prost(string, repeated, tag = "2")]
        pub cmd: Vec<String>,
        #[prost(int64, tag = "3")]
        pub timeout: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExecSyncResponse {
        #[prost(bytes = "vec", tag = "1")]
        pub stdout: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub stderr: Vec<u8>,
        #[prost(int32, tag = "3")]
        pub exit_code: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ImageStatusRequest {
        #[prost(message, optional, tag = "1")]
        pub image: Option<ImageSpec>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Image {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(string, repeated, tag = "2")]
        pub repo_tags: Vec<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ImageStatusResponse {
        #[prost(message, optional, tag = "1")]
        pub image: Option<Image>,
    }
}

/// A failed gRPC call: the `grpc-status` code and message, or a transport failure (code -1).
#[derive(Debug, Clone)]
pub struct CallError {
    pub code: i32,
    pub message: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.code < 0 {
            write!(f, "transport: {}", self.message)
        } else {
            write!(f, "grpc-status {}: {}", self.code, self.message)
        }
    }
}

fn transport(what: &str, e: impl std::fmt::Display) -> CallError {
    CallError { code: -1, message: format!("{what}: {e}") }
}

/// Seconds one CRI call may take (RunPodSandbox runs the whole CNI chain).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(90);

/// One HTTP/2 connection to a CRI endpoint; blocking calls.
pub struct CriClient {
    rt: tokio::runtime::Runtime,
    send: h2::client::SendRequest<Bytes>,
}

impl CriClient {
    /// Connect to the unix socket `path` (HTTP/2 prior knowledge, as gRPC does).
    pub fn connect(path: &Path) -> Result<CriClient, CallError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| transport("tokio runtime", e))?;
        let send = rt.block_on(async {
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| transport(&format!("connect {}", path.display()), e))?;
            let (send, conn) =
                h2::client::handshake(stream).await.map_err(|e| transport("h2 handshake", e))?;
            // The connection task runs whenever a call blocks on the runtime.
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok::<_, CallError>(send)
        })?;
        Ok(CriClient { rt, send })
    }

    /// Unary call of `/<service>/<method>`, e.g. `runtime.v1.RuntimeService/Version`.
    pub fn call<Q: prost::Message, R: prost::Message + Default>(
        &mut self,
        method: &str,
        req: &Q,
    ) -> Result<R, CallError> {
        let body = req.encode_to_vec();
        let mut framed = Vec::with_capacity(body.len() + 5);
        framed.push(0); // not compressed
        framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
        framed.extend_from_slice(&body);
        let request = http::Request::builder()
            .method(http::Method::POST)
            .uri(format!("http://localhost/{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("user-agent", "cni-tests-cri/0")
            .body(())
            .map_err(|e| transport("request", e))?;
        let send = self.send.clone();
        let fut = async move {
            let mut send = send.ready().await.map_err(|e| transport("connection", e))?;
            let (response, mut stream) =
                send.send_request(request, false).map_err(|e| transport("send headers", e))?;
            stream.send_data(Bytes::from(framed), true).map_err(|e| transport("send body", e))?;
            let response = response.await.map_err(|e| transport("response", e))?;
            let (head, mut body) = response.into_parts();
            if head.status != http::StatusCode::OK {
                return Err(transport("http status", head.status));
            }
            let mut data = Vec::new();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.map_err(|e| transport("body", e))?;
                let _ = body.flow_control().release_capacity(chunk.len());
                data.extend_from_slice(chunk.chunk());
            }
            let trailers = body.trailers().await.map_err(|e| transport("trailers", e))?;
            // A call that fails at once answers "trailers-only": the status is in the headers.
            let status_in = |h: &http::HeaderMap| {
                h.get("grpc-status").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i32>().ok())
            };
            let (code, msg) = match trailers.as_ref().and_then(|t| status_in(t).map(|c| (c, t))) {
                Some((c, t)) => (c, t.get("grpc-message").cloned()),
                None => match status_in(&head.headers) {
                    Some(c) => (c, head.headers.get("grpc-message").cloned()),
                    None => return Err(transport("answer", "no grpc-status")),
                },
            };
            if code != 0 {
                let m = msg.map(|v| percent_decode(v.as_bytes())).unwrap_or_default();
                return Err(CallError { code, message: m });
            }
            if data.len() < 5 || data[0] != 0 {
                return Err(transport("answer", format!("bad gRPC frame ({} bytes)", data.len())));
            }
            let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
            if data.len() != 5 + len {
                return Err(transport("answer", format!("frame of {len} bytes in {} bytes", data.len())));
            }
            R::decode(&data[5..]).map_err(|e| transport("decode", e))
        };
        self.rt
            .block_on(async { tokio::time::timeout(CALL_TIMEOUT, fut).await })
            .map_err(|_| transport(method, format!("no answer within {CALL_TIMEOUT:?}")))?
    }

    /// `call` on `runtime.v1.RuntimeService`.
    pub fn runtime<Q: prost::Message, R: prost::Message + Default>(
        &mut self,
        method: &str,
        req: &Q,
    ) -> Result<R, CallError> {
        self.call(&format!("runtime.v1.RuntimeService/{method}"), req)
    }

    pub fn version(&mut self) -> Result<pb::VersionResponse, CallError> {
        self.runtime("Version", &pb::VersionRequest { version: "v1".into() })
    }

    pub fn run_pod_sandbox(&mut self, config: &pb::PodSandboxConfig) -> Result<String, CallError> {
        let req = pb::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() };
        self.runtime::<_, pb::RunPodSandboxResponse>("RunPodSandbox", &req).map(|r| r.pod_sandbox_id)
    }

    pub fn stop_pod_sandbox(&mut self, id: &str) -> Result<(), CallError> {
        let req = pb::PodSandboxIdRequest { pod_sandbox_id: id.into() };
        self.runtime::<_, pb::Empty>("StopPodSandbox", &req).map(|_| ())
    }

    pub fn remove_pod_sandbox(&mut self, id: &str) -> Result<(), CallError> {
        let req = pb::PodSandboxIdRequest { pod_sandbox_id: id.into() };
        self.runtime::<_, pb::Empty>("RemovePodSandbox", &req).map(|_| ())
    }

    pub fn pod_sandbox_status(&mut self, id: &str) -> Result<pb::PodSandboxStatusResponse, CallError> {
        let req = pb::PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: true };
        self.runtime("PodSandboxStatus", &req)
    }

    pub fn list_pod_sandbox(&mut self) -> Result<Vec<pb::PodSandbox>, CallError> {
        self.runtime::<_, pb::ListPodSandboxResponse>("ListPodSandbox", &pb::ListPodSandboxRequest {})
            .map(|r| r.items)
    }

    pub fn create_container(
        &mut self,
        sandbox_id: &str,
        config: &pb::ContainerConfig,
        sandbox_config: &pb::PodSandboxConfig,
    ) -> Result<String, CallError> {
        let req = pb::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config.clone()),
            sandbox_config: Some(sandbox_config.clone()),
        };
        self.runtime::<_, pb::CreateContainerResponse>("CreateContainer", &req).map(|r| r.container_id)
    }

    pub fn start_container(&mut self, id: &str) -> Result<(), CallError> {
        self.runtime::<_, pb::Empty>("StartContainer", &pb::ContainerIdRequest { container_id: id.into() })
            .map(|_| ())
    }

    pub fn container_status(&mut self, id: &str) -> Result<pb::ContainerStatus, CallError> {
        let req = pb::ContainerStatusRequest { container_id: id.into(), verbose: false };
        self.runtime::<_, pb::ContainerStatusResponse>("ContainerStatus", &req)
            .map(|r| r.status.unwrap_or_default())
    }

    /// Run `cmd` in the container; (exit code, stdout, stderr).
    pub fn exec_sync(
        &mut self,
        id: &str,
        cmd: &[&str],
        timeout_s: i64,
    ) -> Result<(i32, String, String), CallError> {
        let req = pb::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: timeout_s,
        };
        self.runtime::<_, pb::ExecSyncResponse>("ExecSync", &req).map(|r| {
            (
                r.exit_code,
                String::from_utf8_lossy(&r.stdout).into_owned(),
                String::from_utf8_lossy(&r.stderr).into_owned(),
            )
        })
    }

    /// The CRI's view of an image reference (None: not known to the CRI).
    pub fn image_status(&mut self, image: &str) -> Result<Option<pb::Image>, CallError> {
        let req = pb::ImageStatusRequest { image: Some(pb::ImageSpec { image: image.into() }) };
        self.call::<_, pb::ImageStatusResponse>("runtime.v1.ImageService/ImageStatus", &req).map(|r| r.image)
    }

    /// The runtime's conditions (`RuntimeReady`, `NetworkReady`, …) as (type, status, message).
    pub fn conditions(&mut self) -> Result<Vec<(String, bool, String)>, CallError> {
        self.runtime::<_, pb::StatusResponse>("Status", &pb::StatusRequest { verbose: false }).map(|r| {
            r.status
                .unwrap_or_default()
                .conditions
                .into_iter()
                .map(|c| (c.r#type, c.status, format!("{} {}", c.reason, c.message)))
                .collect()
        })
    }
}

/// `grpc-message` is percent-encoded (gRPC over HTTP/2, "Responses").
fn percent_decode(b: &[u8]) -> String {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&String::from_utf8_lossy(&b[i + 1..i + 3]), 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The image architecture name of this machine (OCI `architecture`).
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// Pack `rootfs` as a one-layer image in a `docker save`-style archive at `out`, tagged `tag`
/// (e.g. `localhost/cni-tests/busybox:1`), with `cmd` as its default command.
pub fn build_image_archive(rootfs: &Path, out: &Path, tag: &str, cmd: &[&str]) {
    let work = out.with_extension("d");
    std::fs::create_dir_all(&work).expect("image work dir");
    let layer = work.join("layer.tar");
    must(
        "tar the image layer",
        Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "--sort=name", "-C"])
            .arg(rootfs)
            .arg("-cf")
            .arg(&layer)
            .arg(".")
            .output()
            .expect("run tar"),
    );
    let layer_sum = hex(&Sha256::digest(std::fs::read(&layer).expect("read layer")));
    let config = json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": {"Cmd": cmd, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_sum}")]},
        "history": [{"created_by": "cni-tests build_image_archive"}],
    });
    let config_bytes = serde_json::to_vec(&config).unwrap();
    let config_name = format!("{}.json", hex(&Sha256::digest(&config_bytes)));
    std::fs::write(work.join(&config_name), &config_bytes).unwrap();
    std::fs::create_dir_all(work.join(&layer_sum)).unwrap();
    std::fs::rename(&layer, work.join(&layer_sum).join("layer.tar")).unwrap();
    let manifest = json!([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": [format!("{layer_sum}/layer.tar")],
    }]);
    std::fs::write(work.join("manifest.json"), serde_json::to_vec(&manifest).unwrap()).unwrap();
    must(
        "tar the image archive",
        Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
            .arg(&work)
            .arg("-cf")
            .arg(out)
            .args(["manifest.json", &config_name, &layer_sum])
            .output()
            .expect("run tar"),
    );
    let _ = std::fs::remove_dir_all(&work);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Put a recording wrapper for each of `plugins` into `dir`: it saves the call under `log`
/// (one directory per call, named so that they sort by start time) and runs `real_dir/<plugin>`
/// with the same environment and stdin, passing its stdout and exit code through.
pub fn install_recorders(dir: &Path, real_dir: &Path, log: &Path, plugins: &[&str]) {
    std::fs::create_dir_all(dir).expect("recorder bin dir");
    std::fs::create_dir_all(log).expect("recorder log dir");
    for p in plugins {
        let script = format!(
            r#"#!/bin/sh
# cni-tests recorder: log this CNI call, then run the real plugin.
d="{log}/$(date +%s%N)-$$-{p}"
mkdir "$d"
env | grep '^CNI_' > "$d/env"
cat > "$d/stdin"
"{real}" < "$d/stdin" > "$d/stdout"
rc=$?
echo "$rc" > "$d/rc"
cat "$d/stdout"
exit "$rc"
"#,
            log = log.display(),
            real = real_dir.join(p).display(),
        );
        let path = dir.join(p);
        std::fs::write(&path, script).expect("write recorder");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// One recorded plugin call.
#[derive(Debug, Clone)]
pub struct Call {
    /// Directory name: `<ns since epoch>-<pid>-<plugin>`.
    pub key: String,
    pub plugin: String,
    pub env: Vec<(String, String)>,
    pub stdin: Value,
    pub stdout: String,
    /// None while the call is still running.
    pub rc: Option<i32>,
}

impl Call {
    pub fn env(&self, k: &str) -> Option<&str> {
        self.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
    pub fn command(&self) -> &str {
        self.env("CNI_COMMAND").unwrap_or("")
    }
    pub fn container_id(&self) -> &str {
        self.env("CNI_CONTAINERID").unwrap_or("")
    }
    /// The network (conflist) name the call belongs to.
    pub fn network(&self) -> &str {
        self.stdin["name"].as_str().unwrap_or("")
    }
    /// One line for failure messages.
    pub fn summary(&self) -> String {
        format!(
            "{} {} net={} if={} netns={:?} rc={:?}",
            self.plugin,
            self.command(),
            self.network(),
            self.env("CNI_IFNAME").unwrap_or(""),
            self.env("CNI_NETNS").unwrap_or(""),
            self.rc
        )
    }
}

/// The calls recorded so far under `log`, oldest first.
pub fn recorded(log: &Path) -> Vec<Call> {
    let mut keys: Vec<String> = std::fs::read_dir(log)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    keys.sort();
    keys.into_iter()
        .filter_map(|key| {
            let d: PathBuf = log.join(&key);
            let stdin_text = std::fs::read_to_string(d.join("stdin")).ok()?;
            let env = std::fs::read_to_string(d.join("env"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
                .collect();
            Some(Call {
                plugin: key.splitn(3, '-').nth(2).unwrap_or("").to_string(),
                env,
                stdin: serde_json::from_str(&stdin_text).unwrap_or(Value::String(stdin_text)),
                stdout: std::fs::read_to_string(d.join("stdout")).unwrap_or_default(),
                rc: std::fs::read_to_string(d.join("rc")).ok().and_then(|s| s.trim().parse().ok()),
                key,
            })
        })
        .collect()
}

/// The directory of a pinned peer group built by `scripts/install-peers.sh` (containerd,
/// cri-tools, kubelet, plugins): builds it if it is not there yet (one build at a time, under
/// the script's lock) and fails the test loudly, with the script's one-line reason, if it
/// cannot be built — never a fallback to the machine's version.
pub fn peer_dir(group: &str) -> PathBuf {
    let script = crate::workspace_root().join("scripts/install-peers.sh");
    let out = Command::new(&script).arg(group).output().expect("run scripts/install-peers.sh");
    assert!(
        out.status.success(),
        "scripts/install-peers.sh {group} failed: the pinned caller cannot be built here:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&script).args(["--print-dir", group]).output().expect("run install-peers");
    assert!(out.status.success(), "install-peers --print-dir {group}");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A copy of the conf-examples/ conflist `name` with its `cniVersion` set to `version`, the
/// rest byte for byte (the page's examples say 0.4.0; containerd ≥ 2.0.1 runs STATUS only for
/// lists of 1.1.0 and later).
pub fn example_at_version(name: &str, version: &str) -> String {
    let src = crate::workspace_root().join("conf-examples").join(name);
    let text = std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    let v: Value = serde_json::from_str(&text).expect("conflist JSON");
    let old = v["cniVersion"].as_str().expect("a cniVersion");
    let needle = format!("\"cniVersion\": \"{old}\"");
    assert_eq!(text.matches(&needle).count(), 1, "{name}: one top-level {needle}");
    text.replace(&needle, &format!("\"cniVersion\": \"{version}\""))
}
