//! Loading libibverbs at run time and listing devices, on whatever this
//! machine has: the expected outcome is derived from the machine (is the
//! library installed, does the kernel expose RDMA in sysfs), then asserted
//! exactly.

use std::path::Path;

use orbitte_verbs_sys::{DeviceListError, LoadError, Verbs};

/// Loads libibverbs, or says why the test is skipped. Under CI=true the
/// library is a package CI installs (libibverbs1), so its absence fails.
fn verbs_or_skip() -> Option<Verbs> {
    match Verbs::load() {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI installs libibverbs1, yet loading failed: {e}"
            );
            println!("skipped: {e}");
            None
        }
    }
}

#[test]
fn libibverbs_loads_with_every_required_function() {
    let Some(verbs) = verbs_or_skip() else { return };
    assert_eq!(verbs.path(), Path::new(orbitte_verbs_sys::LIBRARY_NAME));
    // The installed release (44.0 here) may lack some optional functions.
    println!("optional functions missing: {:?}", verbs.missing_optional());
    assert_eq!(
        verbs.wc_status_str(orbitte_verbs_sys::bindings::IBV_WC_SUCCESS),
        "success"
    );
    assert_eq!(verbs.wc_status_str(12_345), "unknown");
}

#[test]
fn a_missing_library_is_library_not_found_naming_the_packages() {
    let err = Verbs::load_from("/nonexistent/libibverbs.so.1").expect_err("no such file");
    assert!(matches!(err, LoadError::LibraryNotFound { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("install libibverbs1 and ibverbs-providers"),
        "{text}"
    );
}

#[test]
fn a_library_that_is_not_libibverbs_is_missing_symbol() {
    // libc is on every Linux machine and exports no verbs.
    let err = Verbs::load_from("libc.so.6").expect_err("libc is not libibverbs");
    match err {
        LoadError::MissingSymbol { symbol, .. } => assert_eq!(symbol, "ibv_get_device_list"),
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
}

#[test]
fn device_list_matches_what_the_kernel_exposes() {
    let Some(verbs) = verbs_or_skip() else { return };
    let sysfs = Path::new("/sys/class/infiniband_verbs");
    let uverbs = std::fs::read_dir(sysfs)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("uverbs"))
                .count()
        })
        .ok();
    match (uverbs, verbs.devices()) {
        // No RDMA subsystem in the kernel: libibverbs reports ENOSYS.
        (None, Err(e)) => {
            assert_eq!(
                e,
                DeviceListError::ListFailed {
                    errno: libc::ENOSYS
                }
            );
            assert!(e.kernel_lacks_rdma());
            assert!(e.to_string().contains("no RDMA support"), "{e}");
            println!("no RDMA in this kernel, as expected: {e}");
        }
        // RDMA present but no device: the zero-devices error.
        (Some(0), Err(e)) => assert_eq!(e, DeviceListError::NoDevices),
        // Devices present: every one with a provider is listed, by name.
        (Some(n), Ok(list)) if n > 0 => {
            assert!(!list.is_empty() && list.len() <= n, "{} of {n}", list.len());
            for name in list.names() {
                assert!(!name.is_empty() && name != "?");
            }
            assert_eq!(list.name(list.len()), None);
            println!("devices: {:?}", list.names());
        }
        (uverbs, outcome) => {
            panic!("sysfs shows {uverbs:?} uverbs devices but listing gave {outcome:?}")
        }
    }
}

/// The extended `query_port` a fake provider installs, filling a
/// recognisable port.
unsafe extern "C" fn fake_query_port(
    _ctx: *mut orbitte_verbs_sys::bindings::ibv_context,
    port_num: u8,
    attr: *mut orbitte_verbs_sys::bindings::ibv_port_attr,
    attr_size: usize,
) -> core::ffi::c_int {
    assert_eq!(
        attr_size,
        size_of::<orbitte_verbs_sys::bindings::ibv_port_attr>()
    );
    // SAFETY: `attr` is the caller's valid out-pointer.
    unsafe {
        (*attr).state = orbitte_verbs_sys::bindings::IBV_PORT_ACTIVE;
        (*attr).link_layer = orbitte_verbs_sys::bindings::IBV_LINK_LAYER_ETHERNET as u8;
        (*attr).gid_tbl_len = i32::from(port_num);
    }
    0
}

#[test]
fn query_port_uses_the_providers_extended_op_as_c_does() {
    use orbitte_verbs_sys::bindings::*;
    let Some(verbs) = verbs_or_skip() else { return };
    let mut vctx = Box::<verbs_context>::default();
    vctx.sz = size_of::<verbs_context>();
    vctx.query_port = Some(fake_query_port);
    vctx.context.abi_compat = usize::MAX as *mut core::ffi::c_void;
    let mut attr = ibv_port_attr::default();
    // SAFETY: the fake extended context is live; `attr` is valid.
    let rc = unsafe { verbs.query_port(&mut vctx.context, 7, &mut attr) };
    assert_eq!(rc, 0);
    assert_eq!(attr.state, IBV_PORT_ACTIVE);
    assert_eq!(u32::from(attr.link_layer), IBV_LINK_LAYER_ETHERNET);
    assert_eq!(attr.gid_tbl_len, 7);
}
