//! Booting the guest with qemu and running one command in it.
//!
//! qemu's lifetime is bounded on every path:
//! - it is a single process (no helpers) spawned as our child in our own
//!   process group, so Ctrl-C at a terminal (SIGINT to the foreground group)
//!   reaches it directly and it exits, as a CI runner's SIGTERM to the group
//!   does;
//! - every other exit of this task (command done, boot timeout, command
//!   timeout, guest setup failure, any error or panic) goes through
//!   [`Qemu`]'s `Drop`, which kills and reaps it;
//! - and should this task itself be SIGKILLed, the guest's own watchdog
//!   powers it off once the command's time limit has passed.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::host::{cache_dir, find_tool, secs, verbose};
use super::image::Image;

const BEGIN: &str = "@@ORBITTE-SOFTROCE-BEGIN@@";
const END: &str = "@@ORBITTE-SOFTROCE-END rc=";
const FAIL: &str = "@@ORBITTE-SOFTROCE-FAIL ";

/// How long the guest may take from qemu's start to the command's start
/// (about 14 s under TCG on our machines). `SOFTROCE_BOOT_TIMEOUT` overrides.
const BOOT_TIMEOUT_TCG: Duration = Duration::from_secs(180);
const BOOT_TIMEOUT_KVM: Duration = Duration::from_secs(60);
/// How long powering off may take after the command ended.
const POWEROFF_GRACE: Duration = Duration::from_secs(30);

/// qemu's minimal firmware (Debian's qemu-system-data ships it).
const QBOOT: &str = "/usr/share/qemu/qboot.rom";

/// Environment variables passed from the host into the guest's command.
const PASSED_ENV: &[&str] = &[
    "CI",
    "RUST_BACKTRACE",
    "RUST_LOG",
    "RUST_TEST_THREADS",
    "RUST_TEST_NOCAPTURE",
];

const INSTALL_QEMU: &str = "install it (Debian 12): echo 'deb http://deb.debian.org/debian \
     bookworm-backports main' > /etc/apt/sources.list.d/backports.list && apt-get update && \
     apt-get install -t bookworm-backports qemu-system-x86";

/// Boots `image`, runs `cmd` (a shell command line) in the workspace folder
/// with `ORBITTE_TEST_DEVICE=rxe0`, streams its output to stdout and returns
/// its exit status. `timeout` bounds the command (boot excluded).
pub(crate) fn run(image: &Image, cmd: &str, timeout: Duration) -> Result<i32, String> {
    let qemu = qemu()?;
    let accel = Accel::choose()?;
    let boot_timeout = boot_timeout(accel)?;
    let control = Control::create(cmd, timeout)?;
    let root = crate::workspace::root();
    let shares = shares(&root);

    let kernel = if std::env::var("SOFTROCE_KERNEL").is_ok_and(|k| k == "bzimage") {
        &image.bzimage
    } else {
        &image.vmlinux
    };
    let mut args: Vec<String> = vec![
        "-nographic".into(),
        "-no-reboot".into(),
        "-M".into(),
        "pc".into(),
        "-m".into(),
        "2048".into(),
        "-smp".into(),
        "2".into(),
    ];
    args.extend(accel.args().iter().map(|s| s.to_string()));
    if Path::new(QBOOT).is_file() {
        // qboot: a minimal firmware that boots a -kernel faster than SeaBIOS.
        args.extend(["-bios".into(), QBOOT.into()]);
    }
    args.extend([
        "-kernel".into(),
        path_arg(kernel),
        "-initrd".into(),
        path_arg(&image.initramfs),
        "-append".into(),
        "console=ttyS0 quiet loglevel=3 panic=-1 tsc=reliable".into(),
        "-drive".into(),
        format!(
            "file={},format=raw,if=virtio,snapshot=on",
            qemu_escape(&path_arg(&image.rootfs))
        ),
        "-netdev".into(),
        "user,id=n0".into(),
        "-device".into(),
        "virtio-net-pci,netdev=n0,romfile=".into(),
    ]);
    for (tag, path) in std::iter::once(("control".to_string(), control.dir.clone())).chain(
        shares
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("work{i}"), p.clone())),
    ) {
        args.push("-virtfs".into());
        args.push(format!(
            "local,path={},mount_tag={tag},security_model=none,id={tag}",
            qemu_escape(&path_arg(&path))
        ));
    }
    let mounts: String = shares
        .iter()
        .enumerate()
        .map(|(i, p)| format!("work{i} {}\n", p.display()))
        .collect();
    control.write("mounts", &mounts)?;
    control.write("workdir", &format!("{}\n", root.display()))?;

    eprintln!(
        "softroce: booting the guest ({}, boot limit {}, command limit {})",
        accel.name(),
        secs(boot_timeout),
        secs(timeout)
    );
    let started = Instant::now();
    let mut qemu = Qemu::spawn(&qemu, &args)?;
    let outcome = drive(&mut qemu, &control, boot_timeout, timeout, started);
    qemu.stop();
    let _ = fs::copy(
        control.dir.join("dmesg"),
        cache_dir().join("last-dmesg.log"),
    );
    let rc = outcome?;
    eprintln!(
        "softroce: guest run took {} (exit status {rc})",
        secs(started.elapsed())
    );
    Ok(rc)
}

/// The qemu to run, or how to install it. Called before anything slow.
pub(crate) fn qemu() -> Result<PathBuf, String> {
    qemu_at(std::env::var_os("SOFTROCE_QEMU"))
}

/// The qemu named by `SOFTROCE_QEMU`'s value, else the one on PATH.
fn qemu_at(named: Option<std::ffi::OsString>) -> Result<PathBuf, String> {
    let qemu = match named {
        Some(q) if !q.is_empty() => PathBuf::from(q),
        _ => find_tool("qemu-system-x86_64")
            .ok_or_else(|| format!("qemu-system-x86_64 not found; {INSTALL_QEMU}"))?,
    };
    if qemu.is_file() {
        Ok(qemu)
    } else {
        Err(format!("{} not found; {INSTALL_QEMU}", qemu.display()))
    }
}

/// Follows the console until the guest powers off, printing the command's
/// output, and returns the command's exit status.
fn drive(
    qemu: &mut Qemu,
    control: &Control,
    boot_timeout: Duration,
    timeout: Duration,
    started: Instant,
) -> Result<i32, String> {
    let log_path = cache_dir().join("last-boot.log");
    let mut log = fs::File::create(&log_path)
        .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
    let mut tail: Vec<String> = Vec::new();
    let mut fail: Option<String> = None;
    let mut begun: Option<Instant> = None;
    let mut end_rc: Option<i32> = None;
    let mut ended: Option<Instant> = None;
    let mut signalled: Option<String> = None;
    let stdout = std::io::stdout();
    // Prints the last console lines; returns how the message refers to them.
    let show_tail = |tail: &[String]| {
        for line in tail {
            eprintln!("  | {line}");
        }
        if tail.is_empty() {
            "the guest printed nothing; "
        } else {
            "the last lines are above; "
        }
    };
    loop {
        match qemu.lines.recv_timeout(Duration::from_millis(100)) {
            Ok(Line::Console(line)) => {
                let line = line.trim_end_matches('\r');
                if begun.is_some() && ended.is_none() {
                    if let Some(at) = line.find(END) {
                        let (out, marker) = line.split_at(at);
                        if !out.is_empty() {
                            let _ = writeln!(stdout.lock(), "{out}");
                        }
                        end_rc = marker[END.len()..]
                            .trim_end_matches('@')
                            .parse::<i32>()
                            .ok();
                        ended = Some(Instant::now());
                    } else {
                        if let Some(at) = line.find(FAIL) {
                            // The guest's watchdog, not the command, speaks.
                            fail = Some(line[at + FAIL.len()..].trim_end_matches('@').to_string());
                        }
                        let mut out = stdout.lock();
                        let _ = writeln!(out, "{line}");
                        let _ = out.flush();
                    }
                    continue;
                }
                let _ = writeln!(log, "{line}");
                if verbose() {
                    eprintln!("guest: {line}");
                }
                if line.contains(BEGIN) && begun.is_none() {
                    begun = Some(Instant::now());
                    eprintln!(
                        "softroce: guest up in {} (rxe0 on eth0); command output follows",
                        secs(started.elapsed())
                    );
                } else if let Some(at) = line.find(FAIL) {
                    fail = Some(line[at + FAIL.len()..].trim_end_matches('@').to_string());
                }
                tail.push(line.to_string());
                if tail.len() > 30 {
                    tail.remove(0);
                }
            }
            Ok(Line::Qemu(line)) => {
                let _ = writeln!(log, "qemu: {line}");
                if line.contains("terminating on signal") {
                    signalled = Some(line.clone());
                }
                tail.push(format!("qemu: {line}"));
                if tail.len() > 30 {
                    tail.remove(0);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // qemu closed its output: it has exited (or is about to).
                let status = qemu.wait_exit(Duration::from_secs(5));
                if let Some(line) = signalled {
                    return Err(format!(
                        "qemu was stopped from outside ({line}) before the command finished"
                    ));
                }
                if begun.is_some()
                    && let Some(rc) = control.status().or(end_rc)
                {
                    return Ok(rc);
                }
                if let Some(reason) = fail {
                    let seen = show_tail(&tail);
                    return Err(format!(
                        "the guest failed: {reason}; {seen}the boot log is {}",
                        log_path.display()
                    ));
                }
                if begun.is_none() {
                    let seen = show_tail(&tail);
                    return Err(format!(
                        "qemu exited ({}) before the guest booted; {seen}the boot log is {}",
                        status.unwrap_or_else(|| "status unknown".into()),
                        log_path.display()
                    ));
                }
                let seen = show_tail(&tail);
                return Err(format!(
                    "the guest stopped before the command finished (kernel panic, out of \
                     memory?); {seen}see {} and {}",
                    log_path.display(),
                    cache_dir().join("last-dmesg.log").display()
                ));
            }
        }
        let now = Instant::now();
        if begun.is_none() && now.duration_since(started) > boot_timeout {
            let seen = show_tail(&tail);
            return Err(format!(
                "the guest did not boot within {} (killed qemu); {seen}the boot log is {}; set \
                 SOFTROCE_BOOT_TIMEOUT to wait longer",
                secs(boot_timeout),
                log_path.display()
            ));
        }
        if let (Some(t), None) = (begun, ended)
            && now.duration_since(t) > timeout
        {
            return Err(format!(
                "the command did not finish within {} in the guest (killed qemu); raise it \
                 with --timeout SECS",
                secs(timeout)
            ));
        }
        if let Some(t) = ended
            && now.duration_since(t) > POWEROFF_GRACE
        {
            // The command is done; a guest that does not power off is
            // killed, and the status it wrote still counts.
            return control.status().or(end_rc).ok_or_else(|| {
                "the guest neither powered off nor reported the command's status".to_string()
            });
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    /// KVM only where it really works: /dev/kvm writable and the CPU
    /// advertising vmx or svm. (Our machines' /dev/kvm is kvm-pvm, which
    /// needs a PVM guest kernel: there `-cpu host` aborts and other CPU
    /// models hang, and cpuinfo lists neither flag.)
    fn choose() -> Result<Self, String> {
        match std::env::var("SOFTROCE_ACCEL").as_deref() {
            Ok("kvm") => return Ok(Self::Kvm),
            Ok("tcg") => return Ok(Self::Tcg),
            Ok("") | Err(_) => {}
            Ok(other) => {
                return Err(format!(
                    "SOFTROCE_ACCEL=`{other}` is not `kvm` or `tcg`; unset it to choose \
                     automatically"
                ));
            }
        }
        let writable = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok();
        let vmx = fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| {
            c.lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
        });
        Ok(if writable && vmx {
            Self::Kvm
        } else {
            Self::Tcg
        })
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            Self::Kvm => &["-accel", "kvm", "-cpu", "host"],
            Self::Tcg => &["-accel", "tcg,thread=multi", "-cpu", "max"],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg: software emulation",
        }
    }
}

fn boot_timeout(accel: Accel) -> Result<Duration, String> {
    match std::env::var("SOFTROCE_BOOT_TIMEOUT") {
        Ok(v) => v
            .parse::<u64>()
            .ok()
            .filter(|&s| s > 0)
            .map(Duration::from_secs)
            .ok_or_else(|| {
                format!("SOFTROCE_BOOT_TIMEOUT=`{v}` is not a positive number of seconds")
            }),
        Err(_) => Ok(match accel {
            Accel::Kvm => BOOT_TIMEOUT_KVM,
            Accel::Tcg => BOOT_TIMEOUT_TCG,
        }),
    }
}

/// The host folders shared with the guest, each mounted at the same path:
/// the workspace, and the target folder when it lives elsewhere, so the
/// test binaries and their paths (CARGO_MANIFEST_DIR) work unchanged.
fn shares(root: &Path) -> Vec<PathBuf> {
    let mut shares = vec![root.to_path_buf()];
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from) {
        let target = fs::canonicalize(&target).unwrap_or(target);
        if !target.starts_with(root) {
            shares.push(target);
        }
    }
    shares
}

fn path_arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// qemu's option syntax doubles commas inside a value.
fn qemu_escape(s: &str) -> String {
    s.replace(',', ",,")
}

/// The per-run control folder shared with the guest as tag `control`.
struct Control {
    dir: PathBuf,
}

impl Control {
    fn create(cmd: &str, timeout: Duration) -> Result<Self, String> {
        let cache = cache_dir();
        remove_stale_runs(&cache);
        let dir = cache.join(format!("run-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let control = Self { dir };
        let init = crate::workspace::root().join("ci/softroce/guest-init.sh");
        let text = fs::read_to_string(&init)
            .map_err(|e| format!("cannot read {}: {e}", init.display()))?;
        control.write("guest-init.sh", &text)?;
        let mut env = String::new();
        for name in PASSED_ENV {
            if let Ok(v) = std::env::var(name) {
                env.push_str(&format!("export {name}={}\n", shell_quote(&v)));
            }
        }
        for (name, v) in std::env::vars() {
            if name.starts_with("ORBITTE_") && name != "ORBITTE_TEST_DEVICE" {
                env.push_str(&format!("export {name}={}\n", shell_quote(&v)));
            }
        }
        if std::env::var_os("RUST_BACKTRACE").is_none() {
            env.push_str("export RUST_BACKTRACE=1\n");
        }
        // Plain output, as in a CI log (tracing-subscriber and others honour it).
        match std::env::var("NO_COLOR") {
            Ok(v) => env.push_str(&format!("export NO_COLOR={}\n", shell_quote(&v))),
            Err(_) => env.push_str("export NO_COLOR=1\n"),
        }
        // The guest powers itself off after this (the backstop should this
        // task be killed without a chance to stop qemu).
        env.push_str(&format!(
            "SOFTROCE_WATCHDOG_SECS={}\n",
            timeout.as_secs() + BOOT_TIMEOUT_TCG.as_secs()
        ));
        control.write("env", &env)?;
        control.write("cmd", &format!("{cmd}\n"))?;
        Ok(control)
    }

    fn write(&self, name: &str, text: &str) -> Result<(), String> {
        let path = self.dir.join(name);
        fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// The exit status the guest wrote, if it did.
    fn status(&self) -> Option<i32> {
        fs::read_to_string(self.dir.join("status"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Removes control folders of runs whose task no longer exists (a task
/// stopped with Ctrl-C does not run its destructors).
fn remove_stale_runs(cache: &Path) {
    let Ok(rd) = fs::read_dir(cache) else {
        return;
    };
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("run-")
            && !Path::new("/proc").join(pid).exists()
        {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

enum Line {
    Console(String),
    Qemu(String),
}

/// The running qemu; dropping it kills and reaps it.
struct Qemu {
    child: Child,
    lines: mpsc::Receiver<Line>,
}

impl Qemu {
    fn spawn(qemu: &Path, args: &[String]) -> Result<Self, String> {
        let mut child = Command::new(qemu)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}; {INSTALL_QEMU}", qemu.display()))?;
        let (tx, lines) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            reader(out, tx.clone(), Line::Console);
        }
        if let Some(err) = child.stderr.take() {
            reader(err, tx, Line::Qemu);
        }
        Ok(Self { child, lines })
    }

    /// Waits up to `limit` for qemu to exit on its own; returns its status.
    fn wait_exit(&mut self, limit: Duration) -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status.to_string()),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => return None,
            }
        }
    }

    /// Gives a guest that already powered off a moment, then kills qemu.
    fn stop(&mut self) {
        if self.wait_exit(Duration::from_millis(500)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn reader<R: Read + Send + 'static>(stream: R, tx: mpsc::Sender<Line>, wrap: fn(String) -> Line) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf)
                        .trim_end_matches(['\n', '\r'])
                        .to_string();
                    if tx.send(wrap(line)).is_err() {
                        break;
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes_and_commas() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(qemu_escape("/a,b"), "/a,,b");
    }

    #[test]
    fn a_missing_qemu_names_the_install_command() {
        let err = qemu_at(Some("/nonexistent/qemu".into())).unwrap_err();
        assert!(err.starts_with("/nonexistent/qemu not found"), "{err}");
        assert!(
            err.contains("apt-get install -t bookworm-backports qemu-system-x86"),
            "{err}"
        );
    }
}
