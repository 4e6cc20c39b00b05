//! Shared-memory images of PS state.

use std::path::Path;

use elastrec_checkpoint::error::Check;
use elastrec_checkpoint::shm::ShmImage;
use elastrec_checkpoint::CheckpointError;

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 % 256) as u8).collect()
}

fn flip_byte(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 0x80;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn shm_round_trip_overwrite_and_remove() {
    let root = tempfile::tempdir().unwrap();
    let img = ShmImage::in_root(root.path(), "job-1", "ps-0");
    assert_eq!(img.read().unwrap(), None);
    img.write(3, &payload(10_000)).unwrap();
    assert_eq!(img.read().unwrap(), Some((3, payload(10_000))));
    img.write(4, b"newer").unwrap();
    assert_eq!(img.read().unwrap(), Some((4, b"newer".to_vec())));
    img.write(5, b"").unwrap();
    assert_eq!(img.read().unwrap(), Some((5, vec![])));
    // Only the image is left in the directory: temporary files were renamed away.
    let entries = std::fs::read_dir(img.path().parent().unwrap())
        .unwrap()
        .count();
    assert_eq!(entries, 1);
    img.remove().unwrap();
    img.remove().unwrap();
    assert_eq!(img.read().unwrap(), None);
}

#[test]
fn shm_default_root_is_dev_shm() {
    let ns = format!("test-{}", std::process::id());
    let img = ShmImage::new(&ns, "ps/0");
    if Path::new("/dev/shm").is_dir() {
        assert!(
            img.path().starts_with("/dev/shm/elastrec"),
            "{}",
            img.path().display()
        );
    }
    assert!(img.path().ends_with(format!("{ns}/ps_0.img")));
    img.write(1, b"state").unwrap();
    assert_eq!(img.read().unwrap(), Some((1, b"state".to_vec())));
    img.remove().unwrap();
    let _ = std::fs::remove_dir(img.path().parent().unwrap());
}

#[test]
fn shm_flipped_body_byte_is_corrupt() {
    let root = tempfile::tempdir().unwrap();
    let img = ShmImage::in_root(root.path(), "job", "ps-1");
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
    let root = tempfile::tempdir().unwrap();
    let img = ShmImage::in_root(root.path(), "job", "ps-2");
    img.write(9, &payload(100)).unwrap();
    flip_byte(img.path(), 16);
    assert!(img.read().unwrap_err().is_corrupt());
}

#[test]
fn shm_truncated_or_foreign_files_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let img = ShmImage::in_root(root.path(), "job", "ps-3");
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
