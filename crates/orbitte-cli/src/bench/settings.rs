//! What the bench's flags come to, for the files that set up and run it:
//! the block sizes of a sweep, the range a target publishes, the engines'
//! source ids, the cluster secret, addresses and the op.

use std::net::SocketAddr;

use orbitte::ClusterSecret;

use orbitte::PathKind;

use crate::cli::{BenchArgs, BenchPath, Op, Role};
use crate::failure::Failure;

/// Block sizes of `--sweep`.
pub(crate) const SWEEP: [u64; 6] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];

/// The bytes a target publishes for these settings.
pub(crate) fn range_len(args: &BenchArgs) -> u64 {
    let block = if args.sweep {
        SWEEP[SWEEP.len() - 1].max(args.block_size)
    } else {
        args.block_size
    };
    block * u64::from(args.batch_size) * u64::from(args.threads)
}

/// What the loopback target's source id adds to `--source-id`.
pub(crate) const LOOPBACK_TARGET_SUFFIX: &str = "-target";

/// The longest `--source-id` loopback takes: the target's id, with
/// [`LOOPBACK_TARGET_SUFFIX`], must fit too.
pub(crate) const MAX_LOOPBACK_SOURCE_ID_LEN: usize =
    crate::cli::MAX_SOURCE_ID_LEN - LOOPBACK_TARGET_SUFFIX.len();

/// The source id of the engine playing `role`: `--source-id` (in
/// loopback the target's is `ID-target`, so that the two engines differ),
/// else `orbitte-bench-ROLE-PID`.
pub(crate) fn source_id(args: &BenchArgs, role: &str) -> String {
    match (&args.source_id, args.role) {
        (Some(id), Role::Loopback) if role == "target" => format!("{id}{LOOPBACK_TARGET_SUFFIX}"),
        (Some(id), _) => id.clone(),
        (None, _) => format!("orbitte-bench-{role}-{}", std::process::id()),
    }
}

/// The cluster secret of `--secret-file`, if given.
pub(crate) fn secret(args: &BenchArgs) -> Result<Option<ClusterSecret>, Failure> {
    args.secret_file
        .as_deref()
        .map(|file| orbitte::secret::read_secret_file(file, "--secret-file"))
        .transpose()
        .map_err(|e| Failure::usage(e.to_string()))
}

/// The socket address `s` that `flag` gives (a host name is resolved).
pub(crate) fn parse_addr(s: &str, flag: &str) -> Result<SocketAddr, Failure> {
    use std::net::ToSocketAddrs as _;
    s.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            Failure::usage(format!(
                "{flag} `{s}` is not an address like 127.0.0.1:7400 or host:7400"
            ))
        })
}

/// The op as the engine names it.
pub(crate) fn engine_op(op: Op) -> orbitte::Op {
    match op {
        Op::Read => orbitte::Op::Read,
        Op::Write => orbitte::Op::Write,
    }
}

/// The path `--path` names, for the paths bench measures.
pub(crate) fn path_kind(p: BenchPath) -> Result<PathKind, Failure> {
    match p {
        BenchPath::Rdma => Ok(PathKind::Rdma),
        BenchPath::Tcp => Ok(PathKind::Tcp),
        BenchPath::Local => Ok(PathKind::Local),
        other => Err(Failure::usage(format!(
            "bench measures the rdma, tcp and local paths, not {}; run `orbitte doctor --path {}` for its checks",
            path_name(other),
            path_name(other)
        ))),
    }
}

/// The name `--path` takes for `p`.
pub(crate) fn path_name(p: BenchPath) -> &'static str {
    match p {
        BenchPath::Rdma => "rdma",
        BenchPath::Tcp => "tcp",
        BenchPath::Local => "local",
        BenchPath::CudaStaging => "cuda-staging",
        BenchPath::GpudirectRdma => "gpudirect-rdma",
        BenchPath::CudaIpc => "cuda-ipc",
        BenchPath::Nvlink => "nvlink",
    }
}
