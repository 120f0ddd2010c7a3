//! Peer-supplied text (source ids, host ids, messages) displays escaped:
//! it cannot start a forged log line or drive a terminal.
#![forbid(unsafe_code)]

use orbitte_wire::{HostId, Message, SourceId};

const EVIL: &str = "prefill-0\nWARN forged line\r\x1b[31mred\x07\u{202e}txt\\";
const SHOWN: &str = "prefill-0\\nWARN forged line\\r\\u{1b}[31mred\\u{7}\\u{202e}txt\\\\";

#[test]
fn display_escapes_control_characters() {
    let id = SourceId::new(EVIL).unwrap();
    assert_eq!(id.as_str(), EVIL, "the raw text stays available");
    assert_eq!(id.to_string(), SHOWN);
    assert_eq!(HostId::new(EVIL).unwrap().to_string(), SHOWN);
    assert_eq!(Message::new(EVIL).unwrap().to_string(), SHOWN);
    for shown in [
        id.to_string(),
        format!("{:>5}", Message::new(EVIL).unwrap()),
    ] {
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
    }
}

#[test]
fn ordinary_text_displays_unchanged() {
    for s in ["prefill-3", "décodeur/ノード-1", "a b:c@d"] {
        assert_eq!(SourceId::new(s).unwrap().to_string(), s);
    }
}
