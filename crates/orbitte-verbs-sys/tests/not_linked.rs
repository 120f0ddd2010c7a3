//! The crate never links libibverbs: a binary using it starts, and runs,
//! with no libibverbs mapped until `Verbs::load` opens it. This is its own
//! test binary, so no other test has loaded the library into the process.
#![cfg(target_os = "linux")]

#[test]
fn libibverbs_is_not_mapped_before_it_is_loaded() {
    // Touch the crate, so the binary really depends on it.
    let _ = orbitte_verbs_sys::RDMA_CORE_RELEASE;
    let maps = std::fs::read_to_string("/proc/self/maps").expect("procfs is mounted on Linux");
    assert!(
        !maps.contains("libibverbs"),
        "libibverbs is mapped although nothing loaded it: the crate links it"
    );
    // And the crate can still open it at run time where installed.
    if let Ok(_verbs) = orbitte_verbs_sys::Verbs::load() {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("procfs");
        assert!(maps.contains("libibverbs"), "loading maps the library");
    }
}
