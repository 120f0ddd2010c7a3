//! The guest image: built once from Debian packages, cached by a hash of
//! everything that goes into it.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::host::{cache_dir, find_tool, secs, verbose};

/// Debian release of the guest: its glibc (2.36) must match the host that
/// builds the test binaries (Debian 12).
const SUITE: &str = "bookworm";

/// Packages installed into the guest (debootstrap `--include`): the kernel
/// (with rdma_rxe), rdma-core's runtime and tools, what init needs, and
/// python3 for the Python package's suite (the orbitte wheel and its
/// stdlib-only script; the list is part of the cache key, so a change here
/// rebuilds the image).
const PACKAGES: &[&str] = &[
    "linux-image-amd64",
    "rdma-core",
    "ibverbs-utils",
    "ibverbs-providers",
    "libibverbs1",
    "librdmacm1",
    "rdmacm-utils",
    "perftest",
    "iproute2",
    "kmod",
    "busybox",
    "python3",
];

/// Scripts baked into the image; their text is part of the cache key.
/// (`guest-init.sh` is not baked: each run copies it into the control share.)
const BAKED_SCRIPTS: &[&str] = &["build-image.sh", "initramfs-init.sh", "boot.sh"];

/// Bump when the xtask's own part of the build changes (vmlinux extraction).
const FORMAT: &str = "softroce-image-1";

/// Wall-clock bound on a whole image build (normally about 2 minutes);
/// `SOFTROCE_BUILD_TIMEOUT` (seconds) overrides it.
const BUILD_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// A built guest image.
#[derive(Debug)]
pub(crate) struct Image {
    pub(crate) vmlinux: PathBuf,
    pub(crate) bzimage: PathBuf,
    pub(crate) initramfs: PathBuf,
    pub(crate) rootfs: PathBuf,
}

impl Image {
    fn in_dir(dir: &Path) -> Self {
        Self {
            vmlinux: dir.join("vmlinux"),
            bzimage: dir.join("bzImage"),
            initramfs: dir.join("initramfs.cpio.gz"),
            rootfs: dir.join("rootfs.ext4"),
        }
    }

    fn complete(&self) -> bool {
        [&self.vmlinux, &self.bzimage, &self.initramfs, &self.rootfs]
            .iter()
            .all(|p| p.is_file())
    }
}

/// Returns the cached image for the current inputs, building it first when
/// there is none (or when `rebuild`).
pub(crate) fn ensure(rebuild: bool) -> Result<Image, String> {
    prepare(rebuild)?.finish()
}

/// An image ready to use, or one whose build passed its preflight checks.
#[derive(Debug)]
pub(crate) enum Prepared {
    Cached(Image),
    ToBuild {
        scripts: PathBuf,
        mirror: String,
        key: String,
    },
}

/// Finds the cached image, or checks (quickly) that one can be built: root,
/// the tools, the mirror.
pub(crate) fn prepare(rebuild: bool) -> Result<Prepared, String> {
    let scripts = crate::workspace::root().join("ci/softroce");
    let mirror = mirror();
    let key = cache_key(&scripts, &mirror)?;
    let dir = cache_dir().join(format!("image-{key}"));
    let image = Image::in_dir(&dir);
    if image.complete() && !rebuild {
        eprintln!("softroce: using cached image {}", dir.display());
        return Ok(Prepared::Cached(image));
    }
    preflight_build(&mirror)?;
    Ok(Prepared::ToBuild {
        scripts,
        mirror,
        key,
    })
}

impl Prepared {
    /// The image, built now when it is not cached.
    pub(crate) fn finish(self) -> Result<Image, String> {
        let (scripts, mirror, key) = match self {
            Self::Cached(image) => return Ok(image),
            Self::ToBuild {
                scripts,
                mirror,
                key,
            } => (scripts, mirror, key),
        };
        let cache = cache_dir();
        let dir = cache.join(format!("image-{key}"));
        let started = Instant::now();
        eprintln!(
            "softroce: building the guest image ({SUITE} from {mirror}) into {}",
            dir.display()
        );
        fs::create_dir_all(&cache)
            .map_err(|e| format!("cannot create the cache folder {}: {e}", cache.display()))?;
        remove_dead_builds(&cache);
        let tmp = cache.join(format!("image-{key}.tmp-{}", std::process::id()));
        let _cleanup = RemoveOnDrop(tmp.clone());
        fs::create_dir_all(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
        let log = tmp.join("build.log");
        build_script(&scripts, &tmp, &mirror, &log)?;
        extract_vmlinux(&tmp.join("bzImage"), &tmp.join("vmlinux"))?;
        fs::write(
            tmp.join("inputs.txt"),
            format!(
                "{FORMAT}\nsuite {SUITE}\nmirror {mirror}\npackages {}\n",
                PACKAGES.join(",")
            ),
        )
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        if dir.exists() {
            fs::remove_dir_all(&dir)
                .map_err(|e| format!("cannot replace {}: {e}", dir.display()))?;
        }
        fs::rename(&tmp, &dir).map_err(|e| format!("cannot move the image into place: {e}"))?;
        remove_stale_images(&cache, &dir);
        eprintln!(
            "softroce: image built in {} ({})",
            secs(started.elapsed()),
            dir.display()
        );
        Ok(Image::in_dir(&dir))
    }
}

/// FNV-1a over the build inputs: stable across Rust versions and machines.
fn cache_key(scripts: &Path, mirror: &str) -> Result<String, String> {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes.iter().chain([0u8].iter()) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    feed(FORMAT.as_bytes());
    feed(SUITE.as_bytes());
    feed(mirror.as_bytes());
    feed(PACKAGES.join(",").as_bytes());
    for name in BAKED_SCRIPTS {
        let path = scripts.join(name);
        let text = fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        feed(name.as_bytes());
        feed(&text);
    }
    Ok(format!("{hash:016x}"))
}

/// The Debian mirror: `SOFTROCE_MIRROR`, else the one apt uses, else
/// deb.debian.org.
fn mirror() -> String {
    if let Ok(m) = std::env::var("SOFTROCE_MIRROR")
        && !m.is_empty()
    {
        return m.trim_end_matches('/').to_string();
    }
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(rd) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        more.sort();
        files.extend(more);
    }
    for file in files {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        for line in text.lines() {
            let line = line.trim();
            let uris: Vec<&str> = if let Some(rest) = line.strip_prefix("URIs:") {
                rest.split_whitespace().collect()
            } else if let Some(rest) = line.strip_prefix("deb ") {
                rest.split_whitespace()
                    .filter(|w| !w.starts_with('['))
                    .take(1)
                    .collect()
            } else {
                continue;
            };
            if let Some(uri) = uris.into_iter().find(|u| {
                (u.starts_with("http://") || u.starts_with("https://"))
                    && u.trim_end_matches('/').ends_with("/debian")
            }) {
                return uri.trim_end_matches('/').to_string();
            }
        }
    }
    "http://deb.debian.org/debian".to_string()
}

/// Checks root, the tools and the mirror before spending minutes.
fn preflight_build(mirror: &str) -> Result<(), String> {
    let uid = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .unwrap_or_default();
    if uid != "0" {
        return Err(
            "building the guest image needs root (debootstrap, chroot); run it as root or \
             with sudo"
                .into(),
        );
    }
    for (tool, package) in [
        ("debootstrap", "debootstrap"),
        ("mkfs.ext4", "e2fsprogs"),
        ("cpio", "cpio"),
        ("gzip", "gzip"),
        ("xz", "xz-utils"),
        ("chroot", "coreutils"),
    ] {
        if find_tool(tool).is_none() {
            return Err(format!(
                "`{tool}` not found; install it: apt-get install {package}"
            ));
        }
    }
    probe_mirror(mirror)
}

/// Fetches the suite's Release file header with a bounded wait, so that a
/// missing network is one clear line instead of debootstrap's retries.
fn probe_mirror(mirror: &str) -> Result<(), String> {
    let Some(rest) = mirror.strip_prefix("http://") else {
        return Ok(()); // https: debootstrap reports it; no TLS client here
    };
    if ["http_proxy", "HTTP_PROXY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        return Ok(()); // the proxy, not a direct connection, decides
    }
    let (hostport, path) = rest.split_once('/').unwrap_or((rest, ""));
    let hostport = hostport.to_string();
    let target = if hostport.contains(':') {
        hostport.clone()
    } else {
        format!("{hostport}:80")
    };
    let url = format!("{mirror}/dists/{SUITE}/Release");
    let how = "check the network, or set SOFTROCE_MIRROR to a reachable Debian mirror";
    let (tx, rx) = mpsc::channel();
    let request = format!(
        "HEAD /{path}/dists/{SUITE}/Release HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n",
        path = path.trim_end_matches('/')
    );
    std::thread::spawn(move || {
        let result = (|| -> std::io::Result<String> {
            let addr = target
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| std::io::Error::other("no address"))?;
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.write_all(request.as_bytes())?;
            let mut line = String::new();
            BufReader::new(s).read_line(&mut line)?;
            Ok(line)
        })();
        let _ = tx.send(result);
    });
    match rx.recv_timeout(Duration::from_secs(25)) {
        Ok(Ok(line))
            if line
                .split_whitespace()
                .nth(1)
                .is_some_and(|c| c.starts_with(['2', '3'])) =>
        {
            Ok(())
        }
        Ok(Ok(line)) => Err(format!(
            "the Debian mirror answered `{}` for {url}; {how}",
            line.trim()
        )),
        Ok(Err(e)) => Err(format!(
            "cannot reach the Debian mirror ({url}): {e}; {how}"
        )),
        Err(_) => Err(format!(
            "no answer from the Debian mirror ({url}) within 25 s; {how}"
        )),
    }
}

/// Runs `build-image.sh`, its output going to `log` with its step lines shown.
fn build_script(scripts: &Path, out: &Path, mirror: &str, log: &Path) -> Result<(), String> {
    let mut log_file =
        fs::File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let mut child = Command::new("/bin/sh")
        .arg(scripts.join("build-image.sh"))
        .arg(out)
        .arg(SUITE)
        .arg(mirror)
        .arg(PACKAGES.join(","))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("LC_ALL", "C")
        .spawn()
        .map_err(|e| format!("cannot start ci/softroce/build-image.sh: {e}"))?;
    let (tx, rx) = mpsc::channel::<String>();
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|stream| {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        })
    })
    .collect();
    drop(tx);
    let started = Instant::now();
    let limit = std::env::var("SOFTROCE_BUILD_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&v| v > 0)
        .map_or(BUILD_TIMEOUT, Duration::from_secs);
    let deadline = started + limit;
    let mut tail: Vec<String> = Vec::new();
    let status = loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let _ = writeln!(log_file, "{line}");
                if let Some(step) = line.strip_prefix("softroce-build:") {
                    eprintln!(
                        "softroce-build [{:>5.1} s]:{step}",
                        started.elapsed().as_secs_f64()
                    );
                } else if verbose() {
                    eprintln!("{line}");
                }
                tail.push(line);
                if tail.len() > 25 {
                    tail.remove(0);
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Both streams closed: the script is done; reap it.
                break child
                    .wait()
                    .map_err(|e| format!("waiting for build-image.sh: {e}"))?;
            }
        }
        if Instant::now() > deadline {
            kill_tree(child.id());
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the image build did not finish within {} (stopped it); is the mirror slow? \
                 SOFTROCE_BUILD_TIMEOUT raises the limit",
                secs(limit),
            ));
        }
    };
    for r in readers {
        let _ = r.join();
    }
    if status.success() {
        return Ok(());
    }
    for line in &tail {
        eprintln!("  | {line}");
    }
    let kept = cache_dir().join("last-build.log");
    let _ = fs::copy(log, &kept);
    Err(format!(
        "ci/softroce/build-image.sh failed ({status}); the last lines are above, the whole log \
         is {}",
        kept.display()
    ))
}

/// Extracts the uncompressed ELF kernel from a bzImage (what the kernel's
/// scripts/extract-vmlinux does): the setup header's payload_offset and
/// payload_length locate the compressed kernel, its magic names the
/// decompressor. qemu boots the ELF through its PVH entry, skipping the
/// real-mode setup and the in-guest decompression.
pub(crate) fn extract_vmlinux(bzimage: &Path, out: &Path) -> Result<(), String> {
    let data = fs::read(bzimage).map_err(|e| format!("cannot read {}: {e}", bzimage.display()))?;
    let bad = |why: &str| {
        format!(
            "{} is not a bzImage this xtask understands: {why}",
            bzimage.display()
        )
    };
    let u32_at = |off: usize| -> Option<usize> {
        let b = data.get(off..off + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    if data.get(0x202..0x206) != Some(b"HdrS".as_slice()) {
        return Err(bad("no HdrS signature"));
    }
    let setup_sects = match data.get(0x1f1) {
        Some(0) => 4,
        Some(&n) => usize::from(n),
        None => return Err(bad("truncated")),
    };
    let pm_start = (setup_sects + 1) * 512;
    let (offset, length) = u32_at(0x248)
        .zip(u32_at(0x24c))
        .ok_or_else(|| bad("truncated setup header"))?;
    let payload = data
        .get(pm_start + offset..pm_start + offset + length)
        .ok_or_else(|| bad("payload outside the file"))?
        .to_vec();
    let (tool, args): (&str, &[&str]) = if payload.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        ("xz", &["-dc", "--single-stream"])
    } else if payload.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        ("zstd", &["-dcq"])
    } else if payload.starts_with(&[0x1f, 0x8b]) {
        ("gzip", &["-dc"])
    } else if payload.starts_with(&[0x02, 0x21, 0x4c, 0x18]) {
        ("lz4", &["-dc"])
    } else {
        return Err(bad("unknown compression of the payload"));
    };
    let file =
        fs::File::create(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(file)
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run `{tool}` to decompress the kernel: {e}; install it"))?;
    let mut stdin = child.stdin.take().ok_or("no stdin for the decompressor")?;
    let writer = std::thread::spawn(move || {
        // The payload ends with the uncompressed size (4 bytes); decompressors
        // may stop before reading it, so a broken pipe is expected.
        let _ = stdin.write_all(&payload);
    });
    // The exit status is ignored on purpose (trailing size bytes make some
    // decompressors complain); the result is checked below instead.
    let _ = child.wait();
    let _ = writer.join();
    let mut head = [0u8; 4];
    let ok = fs::File::open(out)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && head == *b"\x7fELF"
        && fs::metadata(out).is_ok_and(|m| m.len() > 1 << 20);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "decompressing the kernel in {} with `{tool}` did not give an ELF vmlinux",
            bzimage.display()
        ))
    }
}

/// Keeps only the current image (each is a few hundred MB on disk).
fn remove_stale_images(cache: &Path, current: &Path) {
    let Ok(rd) = fs::read_dir(cache) else {
        return;
    };
    for entry in rd.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("image-") && !name.contains(".tmp-") && path != current {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// Removes half-built images of builds that were stopped (Ctrl-C runs no
/// destructors) once their builder is gone.
fn remove_dead_builds(cache: &Path) {
    let Ok(rd) = fs::read_dir(cache) else {
        return;
    };
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some((_, pid)) = name.rsplit_once(".tmp-")
            && name.starts_with("image-")
            && !Path::new("/proc").join(pid).exists()
        {
            drop(RemoveOnDrop(entry.path()));
        }
    }
}

/// Kills `pid` and every process below it (the build script's debootstrap,
/// wget, dpkg and chroot children), found through /proc.
fn kill_tree(pid: u32) {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for entry in rd.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces.
            let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let Some(ppid) = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|n| n.parse::<u32>().ok())
            {
                parents.push((p, ppid));
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    let _ = Command::new("kill")
        .arg("-KILL")
        .args(tree.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status();
}

/// Removes a half-built image folder on every exit path.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if !self.0.exists() {
            return;
        }
        // An interrupted debootstrap can leave proc, sysfs or device binds
        // mounted inside the tree: unmount them first, and never delete
        // through a mount point.
        let mounted = || -> Vec<String> {
            let prefix = format!("{}/", self.0.display());
            let text = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
            let mut points: Vec<String> = text
                .lines()
                .filter_map(|l| l.split_whitespace().nth(1))
                .map(|p| p.replace("\\040", " "))
                .filter(|p| p.starts_with(&prefix))
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            points
        };
        for point in mounted() {
            let _ = Command::new("umount")
                .args(["-l", &point])
                .stderr(Stdio::null())
                .status();
        }
        if mounted().is_empty() {
            let _ = fs::remove_dir_all(&self.0);
        } else {
            eprintln!(
                "softroce: left {} in place: something is still mounted inside it",
                self.0.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scripts() -> PathBuf {
        crate::workspace::root().join("ci/softroce")
    }

    /// A fresh folder under the system's temporary folder, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("xtask-softroce-{}-{name}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_cache_key_is_stable_and_follows_the_mirror_and_the_scripts() {
        let a = cache_key(&scripts(), "http://deb.debian.org/debian").unwrap();
        assert_eq!(
            a,
            cache_key(&scripts(), "http://deb.debian.org/debian").unwrap()
        );
        assert_eq!(a.len(), 16);
        let b = cache_key(&scripts(), "http://ftp.de.debian.org/debian").unwrap();
        assert_ne!(a, b);

        let dir = TempDir::new("t1");
        for name in BAKED_SCRIPTS {
            fs::copy(scripts().join(name), dir.path().join(name)).unwrap();
        }
        let copy = cache_key(dir.path(), "http://deb.debian.org/debian").unwrap();
        assert_eq!(a, copy);
        let boot = dir.path().join("boot.sh");
        let mut text = fs::read_to_string(&boot).unwrap();
        text.push_str("# changed\n");
        fs::write(&boot, text).unwrap();
        assert_ne!(
            a,
            cache_key(dir.path(), "http://deb.debian.org/debian").unwrap()
        );
    }

    #[test]
    fn a_missing_script_is_an_error_naming_it() {
        let dir = TempDir::new("t2");
        let err = cache_key(dir.path(), "m").unwrap_err();
        assert!(err.contains("build-image.sh"), "{err}");
    }

    #[test]
    fn every_baked_script_exists_and_is_posix_sh() {
        for name in BAKED_SCRIPTS.iter().chain(&["guest-init.sh"]) {
            let path = scripts().join(name);
            let status = Command::new("sh").arg("-n").arg(&path).status().unwrap();
            assert!(status.success(), "{} does not parse", path.display());
        }
    }

    #[test]
    fn extract_vmlinux_rejects_what_is_not_a_bzimage() {
        let dir = TempDir::new("t3");
        let fake = dir.path().join("bzImage");
        fs::write(&fake, vec![0u8; 4096]).unwrap();
        let err = extract_vmlinux(&fake, &dir.path().join("vmlinux")).unwrap_err();
        assert!(err.contains("no HdrS signature"), "{err}");

        // A header pointing past the end of the file.
        let mut data = vec![0u8; 4096];
        data[0x202..0x206].copy_from_slice(b"HdrS");
        data[0x1f1] = 1;
        data[0x248..0x24c].copy_from_slice(&100u32.to_le_bytes());
        data[0x24c..0x250].copy_from_slice(&100_000u32.to_le_bytes());
        fs::write(&fake, &data).unwrap();
        let err = extract_vmlinux(&fake, &dir.path().join("vmlinux")).unwrap_err();
        assert!(err.contains("payload outside the file"), "{err}");

        // A payload in no known compression.
        data[0x24c..0x250].copy_from_slice(&16u32.to_le_bytes());
        fs::write(&fake, &data).unwrap();
        let err = extract_vmlinux(&fake, &dir.path().join("vmlinux")).unwrap_err();
        assert!(err.contains("unknown compression"), "{err}");
    }

    #[test]
    fn extract_vmlinux_decompresses_a_gzip_payload_and_checks_for_elf() {
        let dir = TempDir::new("t4");
        let elf: Vec<u8> = b"\x7fELF"
            .iter()
            .copied()
            .chain(vec![7u8; 2 << 20])
            .collect();
        let raw = dir.path().join("raw");
        fs::write(&raw, &elf).unwrap();
        let gz = Command::new("gzip")
            .arg("-c")
            .arg(&raw)
            .output()
            .unwrap()
            .stdout;
        let mut data = vec![0u8; 1024];
        data[0x202..0x206].copy_from_slice(b"HdrS");
        data[0x1f1] = 1; // protected-mode code at 1024
        data[0x248..0x24c].copy_from_slice(&0u32.to_le_bytes());
        data[0x24c..0x250].copy_from_slice(&(gz.len() as u32).to_le_bytes());
        data.extend_from_slice(&gz);
        let bz = dir.path().join("bzImage");
        fs::write(&bz, &data).unwrap();
        let out = dir.path().join("vmlinux");
        extract_vmlinux(&bz, &out).unwrap();
        assert_eq!(fs::read(&out).unwrap(), elf);

        // The same with a payload that does not decompress to an ELF.
        let gz = Command::new("gzip")
            .arg("-c")
            .arg(bz.as_path())
            .output()
            .unwrap()
            .stdout;
        data.truncate(1024);
        data[0x24c..0x250].copy_from_slice(&(gz.len() as u32).to_le_bytes());
        data.extend_from_slice(&gz);
        fs::write(&bz, &data).unwrap();
        let err = extract_vmlinux(&bz, &out).unwrap_err();
        assert!(err.contains("did not give an ELF vmlinux"), "{err}");
    }
}
