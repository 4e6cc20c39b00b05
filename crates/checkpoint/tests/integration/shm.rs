//! Shared-memory images of PS state: contents, integrity, privacy of the directories,
//! links that must not be followed, and a full /dev/shm.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use elastrec_checkpoint::error::Check;
use elastrec_checkpoint::shm::{ShmImage, ShmRoot, SHM_ROOT_ENV};
use elastrec_checkpoint::CheckpointError;
use tempfile::TempDir;

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 % 256) as u8).collect()
}

fn flip_byte(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 0x80;
    std::fs::write(path, bytes).unwrap();
}

/// A temporary directory and a root inside it that does not exist yet, so the code under
/// test creates it (a temporary directory's own mode is tempfile's choice, not ours).
fn fresh_root() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("shm");
    (dir, root)
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn assert_unsafe(result: Result<impl std::fmt::Debug, CheckpointError>, path: &Path, why: &str) {
    match result {
        Err(e @ CheckpointError::ShmUnsafe { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains(why), "{msg} lacks {why}");
            assert!(msg.contains("ELASTREC_SHM_ROOT"), "says what to do: {msg}");
            assert!(e.is_shm_unavailable());
        }
        other => panic!("expected ShmUnsafe for {}, got {other:?}", path.display()),
    }
}

#[test]
fn shm_round_trip_overwrite_and_remove() {
    let (_dir, root) = fresh_root();
    let img = ShmImage::in_root(&root, "job-1", "ps-0").unwrap();
    assert_eq!(img.read().unwrap(), None);
    img.write(3, &payload(10_000)).unwrap();
    assert_eq!(img.read().unwrap(), Some((3, payload(10_000))));
    img.write(4, b"newer").unwrap();
    assert_eq!(img.read().unwrap(), Some((4, b"newer".to_vec())));
    img.write(5, b"").unwrap();
    assert_eq!(img.read().unwrap(), Some((5, vec![])));
    // Only the image is left in the directory: temporary files were renamed away.
    assert_eq!(names_in(img.path().parent().unwrap()), ["ps-0.img"]);
    img.remove().unwrap();
    img.remove().unwrap();
    assert_eq!(img.read().unwrap(), None);
}

#[test]
fn shm_images_are_0600_in_0700_directories() {
    let (_dir, root) = fresh_root();
    let img = ShmImage::in_root(&root, "job", "ps-0").unwrap();
    img.write(1, &payload(100)).unwrap();
    assert_eq!(mode(&root), 0o700, "root");
    assert_eq!(mode(img.path().parent().unwrap()), 0o700, "namespace dir");
    assert_eq!(mode(img.path()), 0o600, "image");
    let meta = std::fs::metadata(img.path()).unwrap();
    assert_eq!(meta.uid(), euid());
    // A second image in the same namespace and a reopened root change nothing.
    ShmImage::in_root(&root, "job", "ps-1")
        .unwrap()
        .write(1, b"x")
        .unwrap();
    assert_eq!(mode(&root.join("job").join("ps-1.img")), 0o600);
    assert_eq!(ShmRoot::open(&root).unwrap().path(), root);
}

#[test]
fn shm_default_root_is_per_user_and_env_overrides_it() {
    // The only test that reads or sets ELASTREC_SHM_ROOT; the others pass roots explicitly.
    let saved = std::env::var_os(SHM_ROOT_ENV);
    std::env::remove_var(SHM_ROOT_ENV);
    let ns = format!("test-{}", std::process::id());
    let img = ShmImage::new(&ns, "ps-0").unwrap();
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let root = base.join(format!("elastrec-{}", euid()));
    assert_eq!(img.path(), root.join(&ns).join("ps-0.img"));
    assert_eq!(mode(&root), 0o700);
    img.write(1, b"state").unwrap();
    assert_eq!(img.read().unwrap(), Some((1, b"state".to_vec())));
    ShmRoot::open_default()
        .unwrap()
        .remove_namespace(&ns)
        .unwrap();
    assert!(!root.join(&ns).exists());

    let (_dir, custom) = fresh_root();
    std::env::set_var(SHM_ROOT_ENV, &custom);
    let opened = ShmRoot::open_default();
    match saved {
        Some(v) => std::env::set_var(SHM_ROOT_ENV, v),
        None => std::env::remove_var(SHM_ROOT_ENV),
    }
    assert_eq!(opened.unwrap().path(), custom);
    assert_eq!(mode(&custom), 0o700);
}

#[test]
fn shm_link_at_the_image_path_is_not_followed() {
    let (dir, root) = fresh_root();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let img = ShmImage::in_root(&root, "job", "ps-0").unwrap();
    img.write(1, b"first").unwrap();

    // A link where the image goes is replaced by the new image, not written through.
    std::fs::remove_file(img.path()).unwrap();
    std::os::unix::fs::symlink(&victim, img.path()).unwrap();
    img.write(2, &payload(5000)).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(img.path()).unwrap().is_file());
    assert_eq!(mode(img.path()), 0o600);
    assert_eq!(img.read().unwrap(), Some((2, payload(5000))));

    // A reader refuses a link instead of reading through it; removing it removes the link.
    std::fs::remove_file(img.path()).unwrap();
    std::os::unix::fs::symlink(&victim, img.path()).unwrap();
    let err = img.read().unwrap_err();
    assert!(matches!(err, CheckpointError::BadImage { .. }), "{err}");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    img.remove().unwrap();
    assert!(std::fs::symlink_metadata(img.path()).is_err());
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

#[test]
fn shm_link_at_the_root_or_namespace_is_refused() {
    let (dir, root) = fresh_root();
    // The link points at a directory that would pass every other check.
    let target = dir.path().join("elsewhere");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&target, &root).unwrap();
    assert_unsafe(ShmRoot::open(&root), &root, "symbolic link");
    assert_unsafe(
        ShmImage::in_root(&root, "job", "ps-0"),
        &root,
        "symbolic link",
    );
    assert!(
        names_in(&target).is_empty(),
        "nothing created through the link"
    );

    // Inside a good root, a namespace that is a link is refused by writers and readers.
    let (_dir2, good) = fresh_root();
    let img = ShmImage::in_root(&good, "job", "ps-0").unwrap();
    std::os::unix::fs::symlink(&target, good.join("job")).unwrap();
    assert_unsafe(img.write(1, b"x"), &good.join("job"), "symbolic link");
    assert_unsafe(img.read(), &good.join("job"), "symbolic link");
    assert!(
        names_in(&target).is_empty(),
        "nothing written through the link"
    );
}

#[test]
fn shm_root_of_wrong_mode_kind_or_owner_is_refused() {
    let (dir, root) = fresh_root();
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_unsafe(ShmRoot::open(&root), &root, "mode 0755");
    assert_eq!(mode(&root), 0o755, "refused, not repaired");

    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    assert_unsafe(ShmRoot::open(&file), &file, "not a directory");

    // A root somebody else owns: as root, give one away; otherwise `/` is root's.
    let foreign = if euid() == 0 {
        let d = dir.path().join("foreign");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
        d
    } else {
        PathBuf::from("/")
    };
    assert_unsafe(ShmRoot::open(&foreign), &foreign, "owned by uid");
}

#[test]
fn shm_namespaces_and_names_must_be_plain() {
    let (_dir, root) = fresh_root();
    for ns in [
        "", "..", "a/b", "../up", "a..b", ".hidden", "job 1", "job\n",
    ] {
        match ShmImage::in_root(&root, ns, "ps-0") {
            Err(CheckpointError::Invalid(msg)) => assert!(msg.contains("namespace"), "{msg}"),
            other => panic!("{ns:?}: expected Invalid, got {other:?}"),
        }
    }
    let long = "n".repeat(500);
    let err = ShmImage::in_root(&root, &long, "ps-0").unwrap_err();
    assert!(err.to_string().contains("1 to 128"), "{err}");
    assert!(
        !err.to_string().contains(&long),
        "long names are cut: {err}"
    );
    assert!(matches!(
        ShmImage::in_root(&root, "job", "../ps-0"),
        Err(CheckpointError::Invalid(_))
    ));
    assert!(
        !root.exists(),
        "bad names are refused before anything is created"
    );
    let opened = ShmRoot::open(&root).unwrap();
    assert!(matches!(
        opened.remove_namespace(".."),
        Err(CheckpointError::Invalid(_))
    ));
}

#[test]
fn shm_flipped_body_byte_is_corrupt() {
    let (_dir, root) = fresh_root();
    let img = ShmImage::in_root(&root, "job", "ps-1").unwrap();
    img.write(9, &payload(4096)).unwrap();
    flip_byte(img.path(), 40 + 1234);
    let err = img.read().unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::Corrupt {
                id: 9,
                check: Check::Checksum,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("ps-1.img"), "{err}");
}

#[test]
fn shm_flipped_header_id_is_corrupt() {
    let (_dir, root) = fresh_root();
    let img = ShmImage::in_root(&root, "job", "ps-2").unwrap();
    img.write(9, &payload(100)).unwrap();
    flip_byte(img.path(), 16);
    assert!(img.read().unwrap_err().is_corrupt());
}

#[test]
fn shm_truncated_or_foreign_files_are_refused() {
    let (_dir, root) = fresh_root();
    let img = ShmImage::in_root(&root, "job", "ps-3").unwrap();
    img.write(2, &payload(1000)).unwrap();
    let bytes = std::fs::read(img.path()).unwrap();
    std::fs::write(img.path(), &bytes[..500]).unwrap();
    let err = img.read().unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::Corrupt {
                check: Check::Size,
                ..
            }
        ),
        "{err}"
    );
    std::fs::write(img.path(), &bytes[..20]).unwrap();
    assert!(matches!(img.read(), Err(CheckpointError::BadImage { .. })));
    std::fs::write(img.path(), vec![7u8; 100]).unwrap();
    let err = img.read().unwrap_err();
    assert!(matches!(err, CheckpointError::BadImage { .. }), "{err}");
    assert!(err.to_string().contains("magic"), "{err}");
}

/// Bytes of the image that does not fit: far more than the 64 KiB shared memory below.
const TOO_BIG: usize = 1 << 20;

/// A write that shared memory cannot take fails with the typed error, leaves no file
/// behind, and keeps the previous image readable.
fn assert_failed_write_leaves_nothing(root: &Path) -> CheckpointError {
    let img = ShmImage::in_root(root, "job", "ps-0").unwrap();
    img.write(1, b"small").unwrap();
    let err = img.write(2, &payload(TOO_BIG)).unwrap_err();
    assert!(matches!(err, CheckpointError::ShmWrite { .. }), "{err}");
    assert!(err.is_shm_unavailable(), "{err}");
    assert!(err.to_string().contains("persisted to storage"), "{err}");
    assert_eq!(names_in(img.path().parent().unwrap()), ["ps-0.img"]);
    assert_eq!(img.read().unwrap(), Some((1, b"small".to_vec())));
    err
}

/// A 64 KiB tmpfs, unmounted on drop.
struct TinyTmpfs(CString);

impl TinyTmpfs {
    /// Mounts it on `dir` (created here) with mode 0700; `None` where this process may not
    /// mount (not root, or no CAP_SYS_ADMIN in a container).
    fn mount(dir: &Path) -> Option<Self> {
        std::fs::create_dir(dir).unwrap();
        let target = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let fs = CString::new("tmpfs").unwrap();
        let options = CString::new("size=64k,mode=0700").unwrap();
        // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
        let rc = unsafe {
            libc::mount(
                fs.as_ptr(),
                target.as_ptr(),
                fs.as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        if rc != 0 {
            // Leave the root to be created by the code under test, as in the other tests.
            std::fs::remove_dir(dir).unwrap();
            return None;
        }
        Some(Self(target))
    }
}

impl Drop for TinyTmpfs {
    fn drop(&mut self) {
        // SAFETY: a valid NUL-terminated path. Lazy, so a file still open cannot keep it.
        unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Set in the child process of the fallback below: the root it must write into.
const FSIZE_CHILD_ENV: &str = "ELASTREC_TEST_SHM_FSIZE_ROOT";

#[test]
fn shm_full_is_a_typed_error_and_leaves_nothing() {
    if let Some(root) = std::env::var_os(FSIZE_CHILD_ENV) {
        // The fallback's child: writes beyond its file-size limit fail half way.
        let err = assert_failed_write_leaves_nothing(Path::new(&root));
        println!("child failed as expected: {err}");
        return;
    }
    let (_dir, root) = fresh_root();
    if let Some(_mount) = TinyTmpfs::mount(&root) {
        // A real full tmpfs: the write fails with ENOSPC after filling it.
        let err = assert_failed_write_leaves_nothing(&root);
        assert!(err.to_string().contains("shared memory is full"), "{err}");
        return;
    }
    // No permission to mount: run this test again in a child process whose files may not
    // grow beyond 64 KiB (RLIMIT_FSIZE), so the write fails half way with EFBIG, which is
    // as close to a full tmpfs as an unprivileged process gets. SIGXFSZ is ignored so the
    // write returns the error instead of killing the child.
    eprintln!("cannot mount a tmpfs here; using a file-size limit instead");
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "shm::shm_full_is_a_typed_error_and_leaves_nothing",
            "--nocapture",
        ])
        .env(FSIZE_CHILD_ENV, &root);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        child.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit {
                rlim_cur: 64 << 10,
                rlim_max: 64 << 10,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = child.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("child failed as expected"),
        "child: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(names_in(&root.join("job")), ["ps-0.img"]);
}
