//! Command-line definitions (clap derive).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// OrbitTE: one-sided READ and WRITE between registered memory over RDMA,
/// TCP or shared memory.
#[derive(Debug, Parser)]
#[command(name = "orbitte", version, about, propagate_version = true)]
pub(crate) struct Cli {
    /// Log filter (tracing's env-filter syntax), e.g. `info` or
    /// `orbitte_engine=debug`. Default: `info` for serve, `warn` otherwise.
    #[arg(long, global = true, env = "ORBITTE_LOG", value_name = "FILTER")]
    pub(crate) log: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Print the capability matrix: for each path, the build, discovery,
    /// completion and drain checks with their reasons and fixes.
    Doctor(DoctorArgs),
    /// Print the RDMA topology: NIC IDs (inert slots with their error),
    /// ports, GIDs, NUMA and affinity; discovered versus initialized.
    Topology(TopologyArgs),
    /// Measure transfers: loopback (both ends here), target or initiator.
    Bench(BenchArgs),
    /// Run a target engine from a config file, publishing its ranges.
    Serve(ServeArgs),
}

/// A transfer path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum PathName {
    /// Host Direct: host memory registered on RDMA NICs.
    Rdma,
    /// One-sided operations emulated over TCP sockets.
    Tcp,
    /// Same host, through shared memory.
    Local,
    /// GPU memory through pinned host bounce buffers.
    CudaStaging,
    /// Not implemented.
    GpudirectRdma,
    /// Not implemented.
    CudaIpc,
    /// Not implemented.
    Nvlink,
}

/// A path `bench --path` takes: the ones bench measures. The others parse
/// (hidden from --help) so that bench can point at `doctor` for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BenchPath {
    /// Host Direct: host memory registered on RDMA NICs.
    Rdma,
    /// One-sided operations emulated over TCP sockets.
    Tcp,
    /// Same host, through shared memory.
    Local,
    /// Not measured by bench (refused, pointing at doctor).
    #[value(hide = true)]
    CudaStaging,
    /// Not measured by bench (refused, pointing at doctor).
    #[value(hide = true)]
    GpudirectRdma,
    /// Not measured by bench (refused, pointing at doctor).
    #[value(hide = true)]
    CudaIpc,
    /// Not measured by bench (refused, pointing at doctor).
    #[value(hide = true)]
    Nvlink,
}

#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Only this path; the exit status is non-zero when it does not work.
    #[arg(long, value_enum)]
    pub(crate) path: Option<PathName>,
    /// Machine-readable output.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct TopologyArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub(crate) json: bool,
    /// Read sysfs from this root instead of `/` (for recorded trees).
    #[arg(long, value_name = "DIR")]
    pub(crate) sysfs_root: Option<PathBuf>,
    /// TOML file whose `[rdma]` table configures the selection
    /// (ORBITTE_RDMA_* variables still override it).
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Build an engine here and make one Host Direct registration, which
    /// initializes NIC contexts, then show what was initialized.
    #[arg(long)]
    pub(crate) initialize: bool,
}

/// Direction of the one-sided operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Op {
    /// Initiator reads the target's memory.
    Read,
    /// Initiator writes the target's memory.
    Write,
}

/// The bench's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Role {
    /// Start a target and an initiator in this process (the default).
    Loopback,
    /// Publish a range and wait for initiators.
    Target,
    /// Connect to `--peer` and measure.
    Initiator,
    /// One process of a `--peers` run: builds its share of the initiator
    /// engines and takes its orders from the coordinating `orbitte bench`
    /// on stdin (not for direct use).
    #[value(hide = true)]
    PeersWorker,
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// loopback (both ends here), target, or initiator.
    #[arg(long, value_enum, default_value = "loopback")]
    pub(crate) role: Role,
    /// Where a target listens.
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
    pub(crate) listen: String,
    /// The target an initiator connects to: its address, or with etcd
    /// metadata its source id.
    #[arg(long, value_name = "ADDR|ID", required_if_eq("role", "initiator"))]
    pub(crate) peer: Option<String>,
    /// Where engines are found: `p2p` (the default: `--peer` is an
    /// address) or `etcd://HOST:PORT[/PREFIX]` (the target publishes its
    /// record there; `--peer` is its source id).
    #[arg(long, value_name = "URL", default_value = "p2p", value_parser = crate::metadata::Metadata::parse)]
    pub(crate) metadata: crate::metadata::Metadata,
    /// READ or WRITE.
    #[arg(long, value_enum, default_value = "write")]
    pub(crate) op: Op,
    /// Bytes per request (suffixes K, M, G, T are powers of two).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    pub(crate) block_size: u64,
    /// Requests per submitted batch.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) batch_size: u32,
    /// Initiator threads, each with its own batches.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) threads: u32,
    /// How long to measure, in seconds.
    #[arg(long, default_value_t = 3.0, value_parser = parse_seconds)]
    pub(crate) duration: f64,
    /// The path to measure (rdma, tcp or local). Default: the engine's path
    /// policy picks it (local on one host when the target's memory can be
    /// mapped, else tcp); the report says which path ran.
    #[arg(long, value_enum)]
    pub(crate) path: Option<BenchPath>,
    /// Check every transferred byte against the pattern.
    #[arg(long)]
    pub(crate) check: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub(crate) json: bool,
    /// Sweep block sizes 4K, 16K, ..., 4M (each for --duration) and write
    /// a chart of GB/s against block size, baseline included.
    #[arg(long)]
    pub(crate) sweep: bool,
    /// Where `--sweep` writes its SVG chart (default: orbitte-bench.svg).
    #[arg(long, value_name = "FILE", requires = "sweep")]
    pub(crate) chart: Option<PathBuf>,
    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Skip the baselines (for tcp the same exchange on raw sockets and the
    /// loopback limit, for local memcpy).
    #[arg(long)]
    pub(crate) no_baseline: bool,
    /// Measure the path and its baselines alternately this many times and
    /// report the median round; a baseline the path beats by more than
    /// 10 %, or that varies more than 2x between rounds, is flagged as
    /// suspect instead of giving a ratio. With --peers: the peer counts
    /// take turns this many times and each cell reports its median round.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
    /// With --path rdma: run on the simulated RDMA fabric in this process
    /// (zero-latency, unlimited bandwidth), which measures the engine's
    /// own overhead per slice, not a NIC.
    #[arg(long)]
    pub(crate) sim: bool,
    /// Many peers: for each count N of the list (e.g. 1,16,256,1000), N
    /// initiator engines in `--processes` processes write and read
    /// `--blocks` blocks to one target in this process over loopback; the
    /// report gives aggregate GB/s, latency percentiles, the time to
    /// connect all N, and the target's threads, RSS, descriptors and CPU.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', num_args = 1..,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) peers: Vec<u32>,
    /// With --peers: how many initiator processes share the N engines
    /// (default: N up to 4).
    #[arg(long, value_name = "M", requires = "peers",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) processes: Option<u32>,
    /// With --peers: the block sizes measured, each for READ and WRITE.
    #[arg(long, value_name = "SIZE,SIZE,...", value_delimiter = ',', num_args = 1..,
          default_value = "64K,1M", value_parser = parse_size)]
    pub(crate) blocks: Vec<u64>,
    /// This engine's source id (default: orbitte-bench-ROLE-PID). In
    /// loopback it names the initiator, and the target is ID-target (so
    /// ID has at most 248 bytes there).
    #[arg(long, value_name = "ID", value_parser = parse_source_id)]
    pub(crate) source_id: Option<String>,
    /// A file holding the cluster secret (at least 16 random bytes): the
    /// target and the initiator prove it to each other. Give the target's
    /// `engine.cluster_secret_file` to reach an `orbitte serve` that has
    /// one.
    #[arg(long, value_name = "FILE", env = "ORBITTE_SECRET_FILE")]
    pub(crate) secret_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// TOML file describing the engine and the ranges to publish
    /// (docs/configuration.md).
    #[arg(long, value_name = "FILE", env = "ORBITTE_CONFIG")]
    pub(crate) config: PathBuf,
    /// Check the file (and the ORBITTE_RDMA_* variables), print the
    /// effective configuration with every key, and exit.
    #[arg(long)]
    pub(crate) check: bool,
    /// With --check: print the effective configuration as JSON.
    #[arg(long, requires = "check")]
    pub(crate) json: bool,
    /// Where to publish this engine: `p2p` or `etcd://HOST:PORT[/PREFIX]`
    /// (overrides `engine.metadata` of the file).
    #[arg(long, value_name = "URL", value_parser = crate::metadata::Metadata::parse)]
    pub(crate) metadata: Option<crate::metadata::Metadata>,
    /// Serve the engine's metrics in the Prometheus text format at
    /// http://ADDR/metrics (ADDR like 127.0.0.1:9464; port 0: any free
    /// port, printed at start).
    #[arg(long, value_name = "ADDR", value_parser = parse_metrics_addr)]
    pub(crate) metrics: Option<std::net::SocketAddr>,
    /// Peers the metrics keep apart; the peers past them are counted
    /// together under peer="" (bounds the size of a scrape).
    #[arg(long, value_name = "N", default_value_t = orbitte_engine::metrics::MAX_PEER_ROWS)]
    pub(crate) metrics_peer_rows: usize,
    /// Print a throughput line every SECONDS: payload bytes served per
    /// second, requests per second, sessions open, admitted and refused
    /// in the interval.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, conflicts_with = "check")]
    pub(crate) report_every: Option<f64>,
}

/// `--metrics ADDR`: an IP address and a port.
fn parse_metrics_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse().map_err(|_| {
        format!(
            "`{s}` is not an address to serve metrics on: give IP:PORT, like 127.0.0.1:9464 \
             (a loopback address keeps them on this host) or [::]:9464"
        )
    })
}

/// The longest source id the wire carries, in bytes.
pub(crate) const MAX_SOURCE_ID_LEN: usize = 255;

/// A source id: 1..=255 bytes, no control characters (newlines included).
pub(crate) fn parse_source_id(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > MAX_SOURCE_ID_LEN {
        return Err(format!(
            "a source id has 1 to {MAX_SOURCE_ID_LEN} bytes, this one {}",
            s.len()
        ));
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(format!(
            "{:?} contains the control character {:?}: a source id is printable text like decode-0",
            s, c
        ));
    }
    Ok(s.to_owned())
}

/// Parses `4096`, `64K`, `1M`, `2G`, `1T` (binary multiples).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix `{c}`: use K, M, G or T")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 4096, 64K or 1M"))?;
    let v = n
        .checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))?;
    if v == 0 {
        return Err("size must be at least one byte".into());
    }
    Ok(v)
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a duration in seconds between 0 and 86400"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert!(parse_size("0").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn a_metrics_address_is_ip_and_port() {
        assert_eq!(
            parse_metrics_addr("127.0.0.1:9464").map(|a| a.port()),
            Ok(9464)
        );
        assert!(parse_metrics_addr("[::]:9464").is_ok());
        for bad in ["localhost:9464", "127.0.0.1", ":9464", "127.0.0.1:99999"] {
            let e = parse_metrics_addr(bad).unwrap_err();
            assert!(e.contains("127.0.0.1:9464") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
