//! RdmaConfig from code, TOML and environment, with the documented
//! precedence (code < TOML file < environment), and bad values.
#![forbid(unsafe_code)]

use orbitte_topology::{ConfigError, ConfigOverrides, ENV_VARS, GidType, LinkLayer, RdmaConfig};

#[test]
fn new_pins_device_port_1_and_gid_0() {
    let c = RdmaConfig::new("mlx5_0");
    assert_eq!(c.device.as_deref(), Some("mlx5_0"));
    assert_eq!((c.port, c.gid_index), (Some(1), Some(0)));
    let d = RdmaConfig::default();
    assert_eq!((d.device, d.port, d.gid_index), (None, None, None));
}

#[test]
fn toml_sets_every_field() {
    let text = r#"
        [engine]
        other = "ignored: not ours"

        [rdma]
        device = "mlx5_2"
        port = 2
        gid_index = 3
        gid_type = "RoCE v2"
        netdev = "ens1f0np0"
        link_layer = "ethernet"
        whitelist = ["mlx5_2", "mlx5_3"]
        blacklist = ["mlx5_9"]
    "#;
    let o = ConfigOverrides::from_toml_str(text, "orbitte.toml").unwrap();
    let mut c = RdmaConfig::default();
    c.apply(&o);
    assert_eq!(
        c,
        RdmaConfig::new("mlx5_2")
            .port(2)
            .gid_index(3)
            .gid_type(GidType::RoceV2)
            .netdev("ens1f0np0")
            .link_layer(LinkLayer::Ethernet)
            .whitelist(["mlx5_2", "mlx5_3"])
            .blacklist(["mlx5_9"])
    );
}

#[test]
fn precedence_code_then_toml_then_env_and_auto_clears() {
    let code = RdmaConfig::new("mlx5_0").blacklist(["mlx5_7"]);
    let file = ConfigOverrides::from_toml_str(
        "[rdma]\nport = 2\ngid_index = \"auto\"\ndevice = \"mlx5_1\"\n",
        "f",
    )
    .unwrap();
    let env = ConfigOverrides::from_env_vars([
        ("ORBITTE_RDMA_DEVICE", "mlx5_3"),
        ("ORBITTE_RDMA_GID_TYPE", "v2"),
        ("ORBITTE_RDMA_BLACKLIST", ""),
        ("PATH", "/bin"),
    ])
    .unwrap();
    let mut c = code;
    c.apply(&file);
    c.apply(&env);
    assert_eq!(c.device.as_deref(), Some("mlx5_3")); // env beats file beats code
    assert_eq!(c.port, Some(2)); // file beats code
    assert_eq!(c.gid_index, None); // "auto" cleared the pin of RdmaConfig::new
    assert_eq!(c.gid_type, Some(GidType::RoceV2));
    assert!(c.blacklist.is_empty()); // lists are replaced
    let env = ConfigOverrides::from_env_vars([("ORBITTE_RDMA_PORT", "auto")]).unwrap();
    c.apply(&env);
    assert_eq!(c.port, None);
}

#[test]
fn bad_env_values_name_the_key_and_the_expectation() {
    for (key, value, needle) in [
        ("ORBITTE_RDMA_PORT", "0", "port number 1..=255"),
        ("ORBITTE_RDMA_PORT", "one", "port number"),
        ("ORBITTE_RDMA_GID_INDEX", "-1", "gid table index"),
        ("ORBITTE_RDMA_GID_TYPE", "v3", "roce-v2"),
        (
            "ORBITTE_RDMA_LINK_LAYER",
            "omnipath",
            "infiniband, ethernet",
        ),
        ("ORBITTE_RDMA_DEVICE", "mlx5 0", "device or interface name"),
        ("ORBITTE_RDMA_DEVICE", "", "device or interface name"),
        ("ORBITTE_RDMA_WHITELIST", "mlx5_0,a/b", "comma-separated"),
    ] {
        let err = ConfigOverrides::from_env_vars([(key, value)]).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Env { key: k, .. } if k == key),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains(key) && text.contains(needle), "{text}");
    }
    let err = ConfigOverrides::from_env_vars([("ORBITTE_RDMA_PROT", "1")]).unwrap_err();
    assert!(
        err.to_string()
            .contains("unknown environment variable ORBITTE_RDMA_PROT"),
        "{err}"
    );
}

#[test]
fn bad_toml_names_the_file_and_key() {
    let err = ConfigOverrides::from_toml_str("[rdma\nport = 1", "bad.toml").unwrap_err();
    assert!(
        matches!(&err, ConfigError::Toml { origin, .. } if origin == "bad.toml"),
        "{err:?}"
    );
    for (text, key, needle) in [
        ("[rdma]\nport = 300", "port", "1..=255"),
        ("[rdma]\nport = \"1\"", "port", "port number"),
        ("[rdma]\ngid_type = 2", "gid_type", "roce-v2"),
        (
            "[rdma]\nwhitelist = \"mlx5_0\"",
            "whitelist",
            "list of device names",
        ),
        (
            "[rdma]\nwhitelist = [1]",
            "whitelist",
            "list of device names",
        ),
    ] {
        let err = ConfigOverrides::from_toml_str(text, "orbitte.toml").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("orbitte.toml")
                && msg.contains(&format!("rdma.{key}"))
                && msg.contains(needle),
            "{msg}"
        );
    }
    let err = ConfigOverrides::from_toml_str("rdma = 1", "orbitte.toml").unwrap_err();
    assert!(
        matches!(&err, ConfigError::Value { key, .. } if key == "rdma"),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("key rdma: expected a table [rdma], found integer"),
        "{err}"
    );
    let err = ConfigOverrides::from_toml_str("[rdma]\nprot = 1", "orbitte.toml").unwrap_err();
    assert!(
        matches!(err, ConfigError::UnknownKey { ref key, .. } if key == "prot"),
        "{err}"
    );
    let err = ConfigOverrides::from_toml_file(std::path::Path::new("/nonexistent/orbitte.toml"))
        .unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/orbitte.toml"),
        "{err}"
    );
}

#[test]
fn env_var_list_is_complete() {
    // Every listed variable is accepted, and each has a parse path.
    for key in ENV_VARS {
        assert!(key.starts_with("ORBITTE_RDMA_"));
        ConfigOverrides::from_env_vars([(*key, "auto")]).unwrap();
    }
    assert_eq!(ENV_VARS.len(), 8);
}

#[test]
fn resolve_reads_the_file_layer() {
    let dir = std::env::temp_dir().join(format!("orbitte-topology-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("orbitte.toml");
    std::fs::write(&path, "[rdma]\nport = 2\n").unwrap();
    // The process environment may hold ORBITTE_RDMA_* of the person running
    // the tests; only assert what the environment does not override.
    let env_port = std::env::var_os("ORBITTE_RDMA_PORT").is_some();
    let c = RdmaConfig::resolve(RdmaConfig::new("mlx5_0"), Some(&path));
    std::fs::remove_dir_all(&dir).ok();
    let c = c.unwrap();
    if !env_port {
        assert_eq!(c.port, Some(2));
    }
}
