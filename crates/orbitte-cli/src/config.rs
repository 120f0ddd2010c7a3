//! The TOML file of `orbitte serve`: the engine's settings, the ranges to
//! publish, and the `[rdma]` selectors (parsed by orbitte-topology).
//!
//! Every error names the file, the key and what was expected; unknown keys
//! are errors, so a typo never passes silently. `docs/configuration.md`
//! lists every key, and `tests/configuration_doc.rs` keeps it in step
//! (through `orbitte serve --check --json`, which prints every key).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use orbitte_topology::ConfigOverrides;
use serde::Serialize;

use crate::cli::parse_size;
use crate::metadata::Metadata;

/// Largest config file read (a real one is a few KiB).
const MAX_FILE: u64 = 1 << 20;

/// What a range allows peers to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum RangeAccess {
    /// Peers may READ.
    Read,
    /// Peers may WRITE.
    Write,
    /// Peers may READ and WRITE.
    ReadWrite,
}

/// What a range holds when it is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub(crate) enum Fill {
    /// Every byte is this value.
    Byte(u8),
    /// The pattern `orbitte bench --op read --check` verifies.
    #[serde(serialize_with = "pattern_name")]
    Pattern,
}

fn pattern_name<S: serde::Serializer>(s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("pattern")
}

impl std::fmt::Display for Fill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Byte(b) => write!(f, "{b:#04x}"),
            Self::Pattern => f.write_str("with the bench pattern"),
        }
    }
}

/// One `[[range]]`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RangeConfig {
    pub(crate) name: String,
    pub(crate) size: u64,
    pub(crate) access: RangeAccess,
    /// What every position starts with (default the byte 0).
    pub(crate) fill: Fill,
}

/// The whole file, with defaults filled in.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ServeConfig {
    pub(crate) engine: EngineConfig,
    pub(crate) budgets: BudgetConfig,
    pub(crate) range: Vec<RangeConfig>,
    /// The `[rdma]` table as given (absent keys: discovery).
    pub(crate) rdma: ConfigOverrides,
    /// Whether the file has an `[rdma]` table (then serve also registers
    /// the ranges for Host Direct, and a failure is an error).
    pub(crate) rdma_table: bool,
}

/// `engine.listen` when the file does not set it and the engine has a
/// cluster secret: every interface.
pub(crate) const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 7400);

/// `engine.listen` when the file does not set it and the engine has no
/// cluster secret: this host only, since any peer that reaches an engine
/// without a secret reads and writes what it publishes.
pub(crate) const DEFAULT_LISTEN_OPEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7400);

/// `[engine]`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct EngineConfig {
    pub(crate) source_id: String,
    pub(crate) epoch: Option<u64>,
    pub(crate) last_epoch: Option<u64>,
    pub(crate) listen: SocketAddr,
    /// Whether the file set `engine.listen` (otherwise `serve` picks
    /// [`DEFAULT_LISTEN`] with a cluster secret, [`DEFAULT_LISTEN_OPEN`]
    /// without one).
    #[serde(skip)]
    pub(crate) listen_given: bool,
    /// Where rdma peers open their control link (with an `[rdma]` table).
    pub(crate) control_listen: Option<SocketAddr>,
    pub(crate) cluster_secret_file: Option<String>,
    /// Where the engine publishes itself (`p2p` or an etcd URL).
    pub(crate) metadata: Metadata,
    pub(crate) slice_size: u64,
    pub(crate) request_timeout_ms: u64,
    pub(crate) drain_timeout_ms: u64,
    pub(crate) handshake_timeout_ms: u64,
    /// Closes an authenticated session idle this long (`None`: never).
    pub(crate) idle_timeout_ms: Option<u64>,
    /// Authenticated sessions served at once (`None`: the engine's
    /// default, `SessionConfig::max_sessions`).
    pub(crate) max_sessions: Option<u64>,
    /// With every session slot taken, a newcomer closes the tcp data
    /// session idle the longest if it is idle this long; 0: never
    /// (`None`: the engine's default, `SessionConfig::evict_idle_after`).
    pub(crate) evict_idle_after_ms: Option<u64>,
    pub(crate) max_in_flight: u32,
    pub(crate) signal_interval: u32,
    pub(crate) dispatch_mask: u64,
}

/// `[budgets]`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BudgetConfig {
    pub(crate) max_mrs: u64,
    pub(crate) max_bytes: u64,
}

impl EngineConfig {
    pub(crate) fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
    pub(crate) fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }
    pub(crate) fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }
    pub(crate) fn idle_timeout(&self) -> Option<Duration> {
        self.idle_timeout_ms.map(Duration::from_millis)
    }
    /// `Some(setting)` when the file sets `evict_idle_after_ms`.
    pub(crate) fn evict_idle_after(&self) -> Option<Option<Duration>> {
        self.evict_idle_after_ms
            .map(|ms| (ms > 0).then(|| Duration::from_millis(ms)))
    }
}

/// Keys of each table, for "unknown key" messages.
const ENGINE_KEYS: &[&str] = &[
    "source_id",
    "epoch",
    "last_epoch",
    "listen",
    "control_listen",
    "cluster_secret_file",
    "metadata",
    "slice_size",
    "request_timeout_ms",
    "drain_timeout_ms",
    "handshake_timeout_ms",
    "idle_timeout_ms",
    "max_sessions",
    "evict_idle_after_ms",
    "max_in_flight",
    "signal_interval",
    "dispatch_mask",
];
const BUDGET_KEYS: &[&str] = &["max_mrs", "max_bytes"];
const RANGE_KEYS: &[&str] = &["name", "size", "access", "fill"];
const TABLES: &[&str] = &["engine", "budgets", "range", "rdma"];

/// A config problem: one line naming the file, the key and the fix.
#[derive(Debug)]
pub(crate) struct ConfigError(pub(crate) String);

struct Ctx<'a> {
    origin: &'a str,
}

impl Ctx<'_> {
    fn err(&self, key: &str, expected: &str, found: &toml::Value) -> ConfigError {
        let found = match found {
            toml::Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        ConfigError(format!(
            "config file {}: key {key}: expected {expected}, found {found}",
            self.origin
        ))
    }

    fn unknown(&self, table: &str, key: &str, known: &[&str]) -> ConfigError {
        let key = if table.is_empty() {
            key.to_owned()
        } else {
            format!("{table}.{key}")
        };
        ConfigError(format!(
            "config file {}: unknown key {key}; known: {}",
            self.origin,
            known.join(", ")
        ))
    }

    fn missing(&self, key: &str, fix: &str) -> ConfigError {
        ConfigError(format!(
            "config file {}: key {key} is missing: {fix}",
            self.origin
        ))
    }

    fn u64(&self, key: &str, v: &toml::Value, min: u64, max: u64) -> Result<u64, ConfigError> {
        let expected = format!("an integer {min}..={max}");
        match v {
            toml::Value::Integer(n) => u64::try_from(*n)
                .ok()
                .filter(|n| (min..=max).contains(n))
                .ok_or_else(|| self.err(key, &expected, v)),
            _ => Err(self.err(key, &expected, v)),
        }
    }

    fn size(&self, key: &str, v: &toml::Value) -> Result<u64, ConfigError> {
        const EXPECTED: &str =
            "a size in bytes: an integer or a string like \"64K\", \"1M\", \"2G\"";
        match v {
            toml::Value::Integer(n) if *n > 0 => Ok(*n as u64),
            toml::Value::String(s) => parse_size(s).map_err(|_| self.err(key, EXPECTED, v)),
            _ => Err(self.err(key, EXPECTED, v)),
        }
    }

    fn string<'v>(
        &self,
        key: &str,
        v: &'v toml::Value,
        expected: &str,
    ) -> Result<&'v str, ConfigError> {
        v.as_str().ok_or_else(|| self.err(key, expected, v))
    }
}

/// Reads and checks the file.
pub(crate) fn load(path: &Path) -> Result<ServeConfig, ConfigError> {
    use std::io::Read as _;
    let cannot = |e: &dyn std::fmt::Display| {
        ConfigError(format!(
            "cannot read config file {}: {e}; pass an existing TOML file with --config",
            path.display()
        ))
    };
    let too_large = |n: &str| {
        ConfigError(format!(
            "config file {} is {n}: a config file may have at most 1 MiB; pass the TOML file with --config",
            path.display()
        ))
    };
    let file = std::fs::File::open(path).map_err(|e| cannot(&e))?;
    let meta = file.metadata().map_err(|e| cannot(&e))?;
    if meta.is_dir() {
        return Err(cannot(&"it is a directory"));
    }
    if meta.len() > MAX_FILE {
        return Err(too_large(&format!("{} bytes", meta.len())));
    }
    // Read at most one byte past the limit: a pipe or a device has no
    // length in its metadata.
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| cannot(&e))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(too_large(&format!("more than {MAX_FILE} bytes")));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        ConfigError(format!(
            "config file {}: byte {} is not UTF-8: a TOML file is UTF-8 text",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })?;
    parse(&text, &path.display().to_string())
}

/// One line for a TOML syntax error: where (line, column), the line
/// itself, and what the parser expected.
fn syntax_error(origin: &str, text: &str, e: &toml::de::Error) -> ConfigError {
    let message = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
    let place = e.span().map(|span| {
        let at = span.start.min(text.len());
        let before = &text[..at];
        let line = before.matches('\n').count() + 1;
        let start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = text[start..at].chars().count() + 1;
        let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
        (line, column, text[start..end].trim_end_matches('\r'))
    });
    ConfigError(match place {
        Some((line, column, src)) => format!(
            "config file {origin}: invalid toml at line {line}, column {column}: `{}`: {message}; fix the syntax (see docs/configuration.md)",
            src.chars()
                .map(|c| if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                })
                .collect::<String>()
        ),
        None => format!(
            "config file {origin}: invalid toml: {message}; fix the syntax (see docs/configuration.md)"
        ),
    })
}

/// Parses the text of a config file (`origin` names it in errors).
pub(crate) fn parse(text: &str, origin: &str) -> Result<ServeConfig, ConfigError> {
    let cx = Ctx { origin };
    let root: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| syntax_error(origin, text, &e))?;
    for key in root.keys() {
        if !TABLES.contains(&key.as_str()) {
            return Err(cx.unknown("", key, TABLES));
        }
    }
    let table = |name: &str| -> Result<Option<&toml::Table>, ConfigError> {
        match root.get(name) {
            None => Ok(None),
            Some(toml::Value::Table(t)) => Ok(Some(t)),
            Some(other) => Err(cx.err(name, &format!("a table [{name}]"), other)),
        }
    };
    let engine = parse_engine(&cx, table("engine")?)?;
    let budgets = parse_budgets(&cx, table("budgets")?)?;
    let range = match root.get("range") {
        None => Vec::new(),
        Some(toml::Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| parse_range(&cx, i, v))
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(cx.err("range", "an array of tables [[range]]", other)),
    };
    let mut names: Vec<&str> = range
        .iter()
        .map(|r: &RangeConfig| r.name.as_str())
        .collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(ConfigError(format!(
            "config file {origin}: key range.name: two ranges are named {:?}; give each [[range]] its own name",
            w[0]
        )));
    }
    let (rdma, rdma_table) = match table("rdma")? {
        Some(t) => (
            ConfigOverrides::from_toml_table(t, origin).map_err(|e| ConfigError(e.to_string()))?,
            true,
        ),
        None => (ConfigOverrides::default(), false),
    };
    if engine.control_listen.is_some() && !rdma_table {
        return Err(ConfigError(format!(
            "config file {origin}: key engine.control_listen is set without an [rdma] table: add [rdma] (rdma peers need Host Direct registrations) or remove the key"
        )));
    }
    Ok(ServeConfig {
        engine,
        budgets,
        range,
        rdma,
        rdma_table,
    })
}

fn parse_engine(cx: &Ctx<'_>, t: Option<&toml::Table>) -> Result<EngineConfig, ConfigError> {
    let empty = toml::Table::new();
    let t = t.unwrap_or(&empty);
    for key in t.keys() {
        if !ENGINE_KEYS.contains(&key.as_str()) {
            return Err(cx.unknown("engine", key, ENGINE_KEYS));
        }
    }
    let source_id = match t.get("source_id") {
        Some(v) => {
            let s = cx.string(
                "engine.source_id",
                v,
                "a name like \"decode-0\" (1..=255 printable bytes)",
            )?;
            if s.is_empty() || s.len() > 255 || s.chars().any(|c| c.is_control()) {
                return Err(cx.err(
                    "engine.source_id",
                    "a name like \"decode-0\" (1..=255 printable bytes)",
                    v,
                ));
            }
            s.to_owned()
        }
        None => {
            return Err(cx.missing(
                "engine.source_id",
                "add source_id = \"<stable name of this engine>\" under [engine]",
            ));
        }
    };
    let listen = match t.get("listen") {
        Some(v) => {
            let s = cx.string("engine.listen", v, "an address like \"0.0.0.0:7400\"")?;
            s.parse::<SocketAddr>()
                .map_err(|_| cx.err("engine.listen", "an address like \"0.0.0.0:7400\"", v))?
        }
        None => DEFAULT_LISTEN,
    };
    let listen_given = t.contains_key("listen");
    let control_listen = match t.get("control_listen") {
        Some(v) => {
            let s = cx.string(
                "engine.control_listen",
                v,
                "an address like \"0.0.0.0:7401\"",
            )?;
            Some(s.parse::<SocketAddr>().map_err(|_| {
                cx.err(
                    "engine.control_listen",
                    "an address like \"0.0.0.0:7401\"",
                    v,
                )
            })?)
        }
        None => None,
    };
    let opt_u64 = |key: &str, min: u64, max: u64| -> Result<Option<u64>, ConfigError> {
        t.get(key)
            .map(|v| cx.u64(&format!("engine.{key}"), v, min, max))
            .transpose()
    };
    let max_i64 = i64::MAX as u64;
    let slice_size = match t.get("slice_size") {
        Some(v) => {
            let n = cx.size("engine.slice_size", v)?;
            if n > u64::from(u32::MAX) {
                return Err(cx.err("engine.slice_size", "a size up to 4G - 1", v));
            }
            n
        }
        None => 64 << 10,
    };
    let dispatch_mask = match t.get("dispatch_mask") {
        None => u64::MAX,
        Some(v @ toml::Value::Array(ids)) => {
            let mut m = 0u64;
            for id in ids {
                match id {
                    toml::Value::Integer(n) if (0..64).contains(n) => m |= 1 << n,
                    _ => {
                        return Err(cx.err(
                            "engine.dispatch_mask",
                            "a list of NIC IDs 0..=63, e.g. [0, 1, 4]",
                            v,
                        ));
                    }
                }
            }
            m
        }
        Some(v) => {
            return Err(cx.err(
                "engine.dispatch_mask",
                "a list of NIC IDs 0..=63, e.g. [0, 1, 4]",
                v,
            ));
        }
    };
    let cluster_secret_file = t
        .get("cluster_secret_file")
        .map(|v| {
            cx.string(
                "engine.cluster_secret_file",
                v,
                "a path to a file of at least 16 random bytes",
            )
            .map(str::to_owned)
        })
        .transpose()?;
    let epoch = opt_u64("epoch", 1, max_i64)?;
    let last_epoch = opt_u64("last_epoch", 1, max_i64)?;
    if let (Some(e), Some(last)) = (epoch, last_epoch)
        && e <= last
    {
        return Err(ConfigError(format!(
            "config file {}: key engine.epoch: {e} is not newer than engine.last_epoch {last}: a restarted engine must present a newer epoch (peers refuse an older one); raise engine.epoch or leave it out to choose one newer than last_epoch",
            cx.origin
        )));
    }
    let metadata = match t.get("metadata") {
        None => Metadata::P2p,
        Some(v) => {
            const EXPECTED: &str = "\"p2p\" or \"etcd://HOST:PORT[/PREFIX]\"";
            let s = cx.string("engine.metadata", v, EXPECTED)?;
            Metadata::parse(s).map_err(|_| cx.err("engine.metadata", EXPECTED, v))?
        }
    };
    Ok(EngineConfig {
        source_id,
        epoch,
        last_epoch,
        listen,
        listen_given,
        control_listen,
        cluster_secret_file,
        metadata,
        slice_size,
        request_timeout_ms: opt_u64("request_timeout_ms", 1, 86_400_000)?.unwrap_or(10_000),
        drain_timeout_ms: opt_u64("drain_timeout_ms", 1, 86_400_000)?.unwrap_or(5_000),
        handshake_timeout_ms: opt_u64("handshake_timeout_ms", 1, 86_400_000)?.unwrap_or(5_000),
        idle_timeout_ms: opt_u64("idle_timeout_ms", 1, 86_400_000)?,
        max_sessions: opt_u64("max_sessions", 1, 65_536)?,
        evict_idle_after_ms: opt_u64("evict_idle_after_ms", 0, 86_400_000)?,
        max_in_flight: opt_u64("max_in_flight", 1, 65_536)?.map_or(128, |n| n as u32),
        signal_interval: opt_u64("signal_interval", 1, 65_536)?.map_or(16, |n| n as u32),
        dispatch_mask,
    })
}

fn parse_budgets(cx: &Ctx<'_>, t: Option<&toml::Table>) -> Result<BudgetConfig, ConfigError> {
    let defaults = orbitte::Budgets::default();
    let empty = toml::Table::new();
    let t = t.unwrap_or(&empty);
    for key in t.keys() {
        if !BUDGET_KEYS.contains(&key.as_str()) {
            return Err(cx.unknown("budgets", key, BUDGET_KEYS));
        }
    }
    Ok(BudgetConfig {
        max_mrs: t
            .get("max_mrs")
            .map(|v| cx.u64("budgets.max_mrs", v, 1, u64::from(u32::MAX)))
            .transpose()?
            .unwrap_or(defaults.max_mrs),
        max_bytes: t
            .get("max_bytes")
            .map(|v| cx.size("budgets.max_bytes", v))
            .transpose()?
            .unwrap_or(defaults.max_bytes),
    })
}

fn parse_range(cx: &Ctx<'_>, i: usize, v: &toml::Value) -> Result<RangeConfig, ConfigError> {
    let Some(t) = v.as_table() else {
        return Err(cx.err("range", "an array of tables [[range]]", v));
    };
    for key in t.keys() {
        if !RANGE_KEYS.contains(&key.as_str()) {
            return Err(cx.unknown("range", key, RANGE_KEYS));
        }
    }
    let name = match t.get("name") {
        Some(v) => cx
            .string("range.name", v, "a name like \"kv-cache\"")?
            .to_owned(),
        None => format!("range-{i}"),
    };
    let size = match t.get("size") {
        Some(v) => cx.size("range.size", v)?,
        None => {
            return Err(cx.missing(
                &format!("range.size (range {name:?})"),
                "add size = \"1G\" (or a byte count) to the [[range]]",
            ));
        }
    };
    if size > 1 << 40 {
        return Err(cx.err(
            "range.size",
            "at most 1T per range",
            t.get("size").unwrap_or(&toml::Value::Integer(0)),
        ));
    }
    let access = match t.get("access") {
        None => RangeAccess::ReadWrite,
        Some(v) => match v.as_str() {
            Some("read") => RangeAccess::Read,
            Some("write") => RangeAccess::Write,
            Some("read-write") => RangeAccess::ReadWrite,
            _ => {
                return Err(cx.err(
                    "range.access",
                    "one of \"read\", \"write\", \"read-write\"",
                    v,
                ));
            }
        },
    };
    let fill = match t.get("fill") {
        None => Fill::Byte(0),
        Some(toml::Value::String(p)) if p == "pattern" => Fill::Pattern,
        Some(v @ toml::Value::String(_)) => {
            return Err(cx.err("range.fill", "a byte 0..=255 or \"pattern\"", v));
        }
        Some(v) => Fill::Byte(cx.u64("range.fill", v, 0, 255)? as u8),
    };
    Ok(RangeConfig {
        name,
        size,
        access,
        fill,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(text, "t.toml").unwrap_err().0
    }

    #[test]
    fn minimal_file_gets_defaults() {
        let c = parse("[engine]\nsource_id = \"a\"\n", "t.toml").unwrap();
        assert_eq!(c.engine.slice_size, 64 << 10);
        assert_eq!(c.engine.listen.port(), 7400);
        assert!(c.range.is_empty());
        assert!(!c.rdma_table);
    }

    #[test]
    fn errors_name_the_key_and_the_fix() {
        assert_eq!(
            err("[engine]\nsource_id = \"a\"\nslice_size = \"12X\"\n"),
            "config file t.toml: key engine.slice_size: expected a size in bytes: an integer or a string like \"64K\", \"1M\", \"2G\", found \"12X\""
        );
        assert!(
            err("[engine]\nsource_id = \"a\"\nslise_size = 1\n").starts_with(
                "config file t.toml: unknown key engine.slise_size; known: source_id,"
            )
        );
        assert!(err("[engine]\n").contains("key engine.source_id is missing"));
        assert!(err("[engin]\n").contains("unknown key engin"));
        assert!(
            err("[engine]\nsource_id = \"a\"\n[[range]]\nname = \"x\"\n")
                .contains("range.size (range \"x\") is missing")
        );
        assert!(
            err("[engine]\nsource_id = \"a\"\n[[range]]\nsize = 1\naccess = \"rw\"\n")
                .contains("key range.access: expected one of")
        );
        assert!(err("[engine]\nsource_id = \"a\"\n[rdma]\nport = 0\n").contains("rdma.port"));
        assert_eq!(
            err("[engine]\nsource_id = \"a\"\nlisten = 7400 7401\n"),
            "config file t.toml: invalid toml at line 3, column 15: `listen = 7400 7401`: expected newline, `#`; fix the syntax (see docs/configuration.md)"
        );
        assert!(
            err("[engine\n")
                .starts_with("config file t.toml: invalid toml at line 1, column 8: `[engine`: ")
        );
        assert!(!err("[engine\n").contains('\n'));
        assert!(
            err("[engine]\nsource_id = \"a\"\nepoch = 5\nlast_epoch = 9\n")
                .contains("key engine.epoch: 5 is not newer than engine.last_epoch 9")
        );
        assert!(
            err("[engine]\nsource_id = \"a\"\nmetadata = \"zk://h:1\"\n")
                .contains("key engine.metadata")
        );
        assert!(
            err("[engine]\nsource_id = \"a\"\ndispatch_mask = [64]\n").contains("NIC IDs 0..=63")
        );
    }

    #[test]
    fn a_range_of_1t_is_the_documented_maximum() {
        let c = parse(
            "[engine]\nsource_id = \"a\"\n[[range]]\nsize = \"1T\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(c.range[0].size, 1 << 40);
        assert!(
            err("[engine]\nsource_id = \"a\"\n[[range]]\nsize = 1099511627777\n")
                .contains("at most 1T")
        );
    }

    #[test]
    fn files_over_1_mib_are_refused_before_they_are_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; (1 << 20) + 1]).unwrap();
        let e = load(&big).unwrap_err().0;
        assert!(
            e.contains("is 1048577 bytes: a config file may have at most 1 MiB"),
            "{e}"
        );
        // A device has no length: the read stops past the limit.
        let e = load(Path::new("/dev/zero")).unwrap_err().0;
        assert!(
            e.contains("is more than 1048576 bytes: a config file may have at most 1 MiB"),
            "{e}"
        );
    }

    #[test]
    fn ranges_parse_with_sizes_and_access() {
        let c = parse(
            "[engine]\nsource_id = \"a\"\n[[range]]\nname = \"kv\"\nsize = \"1M\"\naccess = \"read\"\nfill = 7\n[[range]]\nsize = 4096\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(c.range.len(), 2);
        assert_eq!(c.range[0].size, 1 << 20);
        assert_eq!(c.range[0].access, RangeAccess::Read);
        assert_eq!(c.range[0].fill, Fill::Byte(7));
        assert_eq!(c.range[1].name, "range-1");
        assert_eq!(c.range[1].access, RangeAccess::ReadWrite);
    }
}
