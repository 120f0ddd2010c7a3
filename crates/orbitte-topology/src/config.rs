//! `RdmaConfig`: which devices, ports and GIDs to use, from code, a TOML
//! file and `ORBITTE_RDMA_*` environment variables.
//!
//! Precedence, lowest to highest: the value built in code, then the TOML
//! file's `[rdma]` table, then the environment. Each field is replaced
//! separately by the highest layer that mentions it; lists are replaced,
//! not merged; the value `auto` (TOML string or env value) clears a pin.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::model::{GidType, LinkLayer};

/// The environment variables [`ConfigOverrides::from_env`] reads.
pub const ENV_VARS: &[&str] = &[
    ENV_DEVICE,
    ENV_PORT,
    ENV_GID_INDEX,
    ENV_GID_TYPE,
    ENV_NETDEV,
    ENV_LINK_LAYER,
    ENV_WHITELIST,
    ENV_BLACKLIST,
];

const ENV_PREFIX: &str = "ORBITTE_RDMA_";
const ENV_DEVICE: &str = "ORBITTE_RDMA_DEVICE";
const ENV_PORT: &str = "ORBITTE_RDMA_PORT";
const ENV_GID_INDEX: &str = "ORBITTE_RDMA_GID_INDEX";
const ENV_GID_TYPE: &str = "ORBITTE_RDMA_GID_TYPE";
const ENV_NETDEV: &str = "ORBITTE_RDMA_NETDEV";
const ENV_LINK_LAYER: &str = "ORBITTE_RDMA_LINK_LAYER";
const ENV_WHITELIST: &str = "ORBITTE_RDMA_WHITELIST";
const ENV_BLACKLIST: &str = "ORBITTE_RDMA_BLACKLIST";

/// Which RDMA devices, ports and GIDs to use.
///
/// Two ways to start:
/// - [`RdmaConfig::new`] pins a device, port 1 and GID index 0, explicitly.
///   Pins are strict: if that port or GID is not usable, selection fails and
///   says why; it never falls back to another port or GID.
/// - [`RdmaConfig::default`] pins nothing: every usable device, its first
///   active port, and the GID chosen automatically
///   ([`choose_gid`](crate::choose_gid)). Optional selectors narrow it.
///
/// Every `Some` field is a pin or a filter; `None` means "discover".
/// A nonempty `whitelist` takes precedence over the `blacklist` (the
/// blacklist is then ignored) and still intersects a `device` pin.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct RdmaConfig {
    /// Use only this device (strict).
    pub device: Option<String>,
    /// Use only this port number on each device (strict).
    pub port: Option<u32>,
    /// Use only this GID table index (strict).
    pub gid_index: Option<u32>,
    /// Use only GIDs of this type.
    pub gid_type: Option<GidType>,
    /// Use only GIDs on this network interface.
    pub netdev: Option<String>,
    /// Use only ports with this link layer.
    pub link_layer: Option<LinkLayer>,
    /// If nonempty, use only these devices (and ignore the blacklist).
    pub whitelist: Vec<String>,
    /// Never use these devices (ignored when the whitelist is nonempty).
    pub blacklist: Vec<String>,
}

impl RdmaConfig {
    /// Pins `device`, port 1 and GID index 0, explicitly and strictly.
    pub fn new(device: impl Into<String>) -> Self {
        Self {
            device: Some(device.into()),
            port: Some(1),
            gid_index: Some(0),
            ..Self::default()
        }
    }

    /// Pins the device.
    pub fn device(mut self, device: impl Into<String>) -> Self {
        self.device = Some(device.into());
        self
    }

    /// Pins the port number.
    pub fn port(mut self, port: u32) -> Self {
        self.port = Some(port);
        self
    }

    /// Pins the GID index.
    pub fn gid_index(mut self, index: u32) -> Self {
        self.gid_index = Some(index);
        self
    }

    /// Accepts only GIDs of this type.
    pub fn gid_type(mut self, gid_type: GidType) -> Self {
        self.gid_type = Some(gid_type);
        self
    }

    /// Accepts only GIDs on this network interface.
    pub fn netdev(mut self, netdev: impl Into<String>) -> Self {
        self.netdev = Some(netdev.into());
        self
    }

    /// Accepts only ports with this link layer.
    pub fn link_layer(mut self, link_layer: LinkLayer) -> Self {
        self.link_layer = Some(link_layer);
        self
    }

    /// Sets the whitelist.
    pub fn whitelist<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.whitelist = names.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the blacklist.
    pub fn blacklist<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.blacklist = names.into_iter().map(Into::into).collect();
        self
    }

    /// Applies a layer of overrides on top of this configuration.
    pub fn apply(&mut self, o: &ConfigOverrides) {
        fn set<T: Clone>(field: &mut Option<T>, o: &Option<Option<T>>) {
            if let Some(v) = o {
                field.clone_from(v);
            }
        }
        set(&mut self.device, &o.device);
        set(&mut self.port, &o.port);
        set(&mut self.gid_index, &o.gid_index);
        set(&mut self.gid_type, &o.gid_type);
        set(&mut self.netdev, &o.netdev);
        set(&mut self.link_layer, &o.link_layer);
        if let Some(w) = &o.whitelist {
            self.whitelist.clone_from(w);
        }
        if let Some(b) = &o.blacklist {
            self.blacklist.clone_from(b);
        }
    }

    /// The configuration built in code, overridden by the TOML file (if
    /// any) and then by the process environment: the one documented
    /// precedence.
    pub fn resolve(code: Self, toml_file: Option<&Path>) -> Result<Self, ConfigError> {
        let env = ConfigOverrides::from_env()?;
        let file = toml_file.map(ConfigOverrides::from_toml_file).transpose()?;
        let mut config = code;
        if let Some(file) = &file {
            config.apply(file);
        }
        config.apply(&env);
        Ok(config)
    }

    /// Whether the device name passes the whitelist/blacklist/pin algebra.
    pub fn admits_device(&self, name: &str) -> bool {
        let pinned = self.device.as_deref().is_none_or(|d| d == name);
        let listed = if self.whitelist.is_empty() {
            !self.blacklist.iter().any(|b| b == name)
        } else {
            self.whitelist.iter().any(|w| w == name)
        };
        pinned && listed
    }
}

impl fmt::Display for RdmaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn opt<T: fmt::Display>(v: &Option<T>) -> String {
            v.as_ref()
                .map_or_else(|| "auto".to_owned(), ToString::to_string)
        }
        write!(
            f,
            "device={} port={} gid_index={} gid_type={} netdev={} link_layer={}",
            opt(&self.device),
            opt(&self.port),
            opt(&self.gid_index),
            opt(&self.gid_type),
            opt(&self.netdev),
            opt(&self.link_layer)
        )?;
        if !self.whitelist.is_empty() {
            write!(f, " whitelist=[{}]", self.whitelist.join(","))?;
        }
        if !self.blacklist.is_empty() {
            write!(f, " blacklist=[{}]", self.blacklist.join(","))?;
        }
        Ok(())
    }
}

/// One configuration layer (a TOML file or the environment): for each
/// field, `None` = not mentioned, `Some(None)` = `auto` (clear the pin),
/// `Some(Some(v))` = set.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[allow(clippy::option_option)] // three states are the point: absent, auto, set
pub struct ConfigOverrides {
    /// `device` / `ORBITTE_RDMA_DEVICE`.
    pub device: Option<Option<String>>,
    /// `port` / `ORBITTE_RDMA_PORT`.
    pub port: Option<Option<u32>>,
    /// `gid_index` / `ORBITTE_RDMA_GID_INDEX`.
    pub gid_index: Option<Option<u32>>,
    /// `gid_type` / `ORBITTE_RDMA_GID_TYPE`.
    pub gid_type: Option<Option<GidType>>,
    /// `netdev` / `ORBITTE_RDMA_NETDEV`.
    pub netdev: Option<Option<String>>,
    /// `link_layer` / `ORBITTE_RDMA_LINK_LAYER`.
    pub link_layer: Option<Option<LinkLayer>>,
    /// `whitelist` / `ORBITTE_RDMA_WHITELIST` (comma-separated).
    pub whitelist: Option<Vec<String>>,
    /// `blacklist` / `ORBITTE_RDMA_BLACKLIST` (comma-separated).
    pub blacklist: Option<Vec<String>>,
}

/// A configuration value could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
pub enum ConfigError {
    /// An environment variable holds a value of the wrong form.
    #[error("environment variable {key}={value:?}: expected {expected}")]
    Env {
        /// The variable name.
        key: String,
        /// Its value (lossy if it was not UTF-8).
        value: String,
        /// What the value should look like.
        expected: &'static str,
    },
    /// An `ORBITTE_RDMA_*` variable that this crate does not know (a typo).
    #[error("unknown environment variable {key}; known: {}", ENV_VARS.join(", "))]
    UnknownEnv {
        /// The variable name.
        key: String,
    },
    /// The TOML file could not be read.
    #[error("cannot read config file {path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error text.
        message: String,
    },
    /// The TOML file is not valid TOML.
    #[error("config file {origin}: invalid toml: {message}")]
    Toml {
        /// The file (or `<string>`).
        origin: String,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A key of the `[rdma]` table holds a value of the wrong form.
    #[error("config file {origin}: key {key}: expected {expected}, found {found}")]
    Value {
        /// The file (or `<string>`).
        origin: String,
        /// The dotted key (`rdma.port`).
        key: String,
        /// What the value should look like.
        expected: &'static str,
        /// What it is.
        found: String,
    },
    /// The `[rdma]` table holds a key this crate does not know.
    #[error(
        "config file {origin}: unknown key rdma.{key}; known: device, port, gid_index, \
         gid_type, netdev, link_layer, whitelist, blacklist"
    )]
    UnknownKey {
        /// The file (or `<string>`).
        origin: String,
        /// The unknown key.
        key: String,
    },
}

const EXPECT_NAME: &str = "a device or interface name (no spaces, no '/'), or \"auto\"";
const EXPECT_PORT: &str = "a port number 1..=255, or \"auto\"";
const EXPECT_GID_INDEX: &str = "a gid table index 0..=65535, or \"auto\"";
const EXPECT_GID_TYPE: &str = "one of ib, roce-v1, roce-v2, or \"auto\"";
const EXPECT_LINK_LAYER: &str = "one of infiniband, ethernet, or \"auto\"";
const EXPECT_LIST: &str = "a list of device names";

fn is_auto(s: &str) -> bool {
    s.eq_ignore_ascii_case("auto")
}

fn parse_name(s: &str) -> Option<Option<String>> {
    let s = s.trim();
    if is_auto(s) {
        Some(None)
    } else if valid_name(s) {
        Some(Some(s.to_owned()))
    } else {
        None
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && !s.contains('/') && !s.chars().any(char::is_whitespace)
}

fn parse_num(s: &str, min: u32, max: u32) -> Option<Option<u32>> {
    let s = s.trim();
    if is_auto(s) {
        return Some(None);
    }
    let n: u32 = s.parse().ok()?;
    (min..=max).contains(&n).then_some(Some(n))
}

fn parse_auto<T: FromStr>(s: &str) -> Option<Option<T>> {
    let s = s.trim();
    if is_auto(s) {
        Some(None)
    } else {
        s.parse().ok().map(Some)
    }
}

fn parse_list(s: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if !valid_name(part) {
            return None;
        }
        out.push(part.to_owned());
    }
    Some(out)
}

impl FromStr for GidType {
    type Err = ();

    /// `ib`, `roce-v1`/`v1`, `roce-v2`/`v2`, case and separators ignored
    /// (`RoCE v2` parses).
    fn from_str(s: &str) -> Result<Self, ()> {
        let norm: String = s
            .chars()
            .filter(|c| !matches!(c, ' ' | '-' | '_'))
            .collect::<String>()
            .to_ascii_lowercase();
        match norm.as_str() {
            "ib" | "infiniband" => Ok(Self::Ib),
            "rocev1" | "v1" => Ok(Self::RoceV1),
            "rocev2" | "v2" => Ok(Self::RoceV2),
            _ => Err(()),
        }
    }
}

impl FromStr for LinkLayer {
    type Err = ();

    /// `infiniband`/`ib`, `ethernet`/`eth`, case ignored.
    fn from_str(s: &str) -> Result<Self, ()> {
        match s.trim().to_ascii_lowercase().as_str() {
            "infiniband" | "ib" => Ok(Self::InfiniBand),
            "ethernet" | "eth" => Ok(Self::Ethernet),
            _ => Err(()),
        }
    }
}

impl ConfigOverrides {
    /// The `ORBITTE_RDMA_*` variables of the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        let vars = std::env::vars_os().filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            k.starts_with(ENV_PREFIX).then(|| {
                (
                    k,
                    v.into_string()
                        .map_err(|v| v.to_string_lossy().into_owned()),
                )
            })
        });
        let mut o = Self::default();
        for (key, value) in vars {
            let value = value.map_err(|value| ConfigError::Env {
                key: key.clone(),
                value,
                expected: "valid UTF-8",
            })?;
            o.set_env(&key, &value)?;
        }
        Ok(o)
    }

    /// The `ORBITTE_RDMA_*` variables among `vars` (other names are
    /// ignored); for tests and callers with their own environment.
    pub fn from_env_vars<K: AsRef<str>, V: AsRef<str>>(
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, ConfigError> {
        let mut o = Self::default();
        for (k, v) in vars {
            if k.as_ref().starts_with(ENV_PREFIX) {
                o.set_env(k.as_ref(), v.as_ref())?;
            }
        }
        Ok(o)
    }

    fn set_env(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let bad = |expected| ConfigError::Env {
            key: key.to_owned(),
            value: value.to_owned(),
            expected,
        };
        match key {
            ENV_DEVICE => self.device = Some(parse_name(value).ok_or_else(|| bad(EXPECT_NAME))?),
            ENV_NETDEV => self.netdev = Some(parse_name(value).ok_or_else(|| bad(EXPECT_NAME))?),
            ENV_PORT => self.port = Some(parse_num(value, 1, 255).ok_or_else(|| bad(EXPECT_PORT))?),
            ENV_GID_INDEX => {
                self.gid_index =
                    Some(parse_num(value, 0, 65535).ok_or_else(|| bad(EXPECT_GID_INDEX))?);
            }
            ENV_GID_TYPE => {
                self.gid_type = Some(parse_auto(value).ok_or_else(|| bad(EXPECT_GID_TYPE))?);
            }
            ENV_LINK_LAYER => {
                self.link_layer = Some(parse_auto(value).ok_or_else(|| bad(EXPECT_LINK_LAYER))?);
            }
            ENV_WHITELIST => {
                self.whitelist =
                    Some(parse_list(value).ok_or_else(|| bad("comma-separated device names"))?);
            }
            ENV_BLACKLIST => {
                self.blacklist =
                    Some(parse_list(value).ok_or_else(|| bad("comma-separated device names"))?);
            }
            _ => {
                return Err(ConfigError::UnknownEnv {
                    key: key.to_owned(),
                });
            }
        }
        Ok(())
    }

    /// The `[rdma]` table of a TOML file. Other tables are ignored (the
    /// file may configure other parts of OrbitTE); unknown keys inside
    /// `[rdma]` are errors.
    pub fn from_toml_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// Like [`from_toml_file`](Self::from_toml_file), from text; `origin`
    /// names the source in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Toml {
                origin: origin.to_owned(),
                message: e.to_string().trim().to_owned(),
            })?;
        match table.get("rdma") {
            None => Ok(Self::default()),
            Some(toml::Value::Table(rdma)) => Self::from_toml_table(rdma, origin),
            Some(other) => Err(ConfigError::Value {
                origin: origin.to_owned(),
                key: "rdma".to_owned(),
                expected: "a table [rdma]",
                found: other.type_str().to_owned(),
            }),
        }
    }

    /// The overrides in an `[rdma]` table already parsed by the caller.
    pub fn from_toml_table(rdma: &toml::Table, origin: &str) -> Result<Self, ConfigError> {
        let mut o = Self::default();
        for (key, value) in rdma {
            let bad = |expected| ConfigError::Value {
                origin: origin.to_owned(),
                key: format!("rdma.{key}"),
                expected,
                found: match value {
                    toml::Value::String(s) => format!("{s:?}"),
                    other => other.to_string(),
                },
            };
            let text = || value.as_str();
            let num = |min: u32, max: u32, expected| match value {
                toml::Value::Integer(n) => u32::try_from(*n)
                    .ok()
                    .filter(|n| (min..=max).contains(n))
                    .map(Some)
                    .ok_or_else(|| bad(expected)),
                toml::Value::String(s) if is_auto(s) => Ok(None),
                _ => Err(bad(expected)),
            };
            let list = || -> Result<Vec<String>, ConfigError> {
                let arr = value.as_array().ok_or_else(|| bad(EXPECT_LIST))?;
                arr.iter()
                    .map(|v| {
                        v.as_str()
                            .filter(|s| valid_name(s))
                            .map(str::to_owned)
                            .ok_or_else(|| bad(EXPECT_LIST))
                    })
                    .collect()
            };
            match key.as_str() {
                "device" => {
                    o.device = Some(
                        text()
                            .and_then(parse_name)
                            .ok_or_else(|| bad(EXPECT_NAME))?,
                    )
                }
                "netdev" => {
                    o.netdev = Some(
                        text()
                            .and_then(parse_name)
                            .ok_or_else(|| bad(EXPECT_NAME))?,
                    )
                }
                "port" => o.port = Some(num(1, 255, EXPECT_PORT)?),
                "gid_index" => o.gid_index = Some(num(0, 65535, EXPECT_GID_INDEX)?),
                "gid_type" => {
                    o.gid_type = Some(
                        text()
                            .and_then(parse_auto)
                            .ok_or_else(|| bad(EXPECT_GID_TYPE))?,
                    );
                }
                "link_layer" => {
                    o.link_layer = Some(
                        text()
                            .and_then(parse_auto)
                            .ok_or_else(|| bad(EXPECT_LINK_LAYER))?,
                    );
                }
                "whitelist" => o.whitelist = Some(list()?),
                "blacklist" => o.blacklist = Some(list()?),
                _ => {
                    return Err(ConfigError::UnknownKey {
                        origin: origin.to_owned(),
                        key: key.clone(),
                    });
                }
            }
        }
        Ok(o)
    }
}
