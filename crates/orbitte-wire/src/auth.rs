//! Optional challenge/response authentication with a cluster secret.
//!
//! Every engine of a cluster is configured with the same secret (or none).
//! The responder opens each session with a `challenge` carrying a fresh
//! nonce; the initiator's `hello` proves knowledge of the secret with an
//! HMAC-SHA256 over that nonce and the hello itself; the responder's
//! `hello-ack` proves it back with an HMAC over both nonces, the hello and
//! the ack. A replayed hello fails because the challenge nonce differs; a
//! replayed ack fails because the hello nonce differs. The secret never
//! travels.
//!
//! ```text
//! hello proof = HMAC-SHA256(secret, "OrbitTE/1 hello\0"
//!                                   || challenge.nonce
//!                                   || hello body up to (excluding) the proof tag)
//! ack proof   = HMAC-SHA256(secret, "OrbitTE/1 hello-ack\0"
//!                                   || challenge.nonce
//!                                   || hello body up to (excluding) the proof tag
//!                                   || ack body up to (excluding) the proof tag)
//! ```
//!
//! Both sides must agree on whether a secret is in use: a proof where none
//! is expected fails as surely as a missing one, so a misconfigured cluster
//! fails loudly instead of running half-authenticated.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::codec::Writer;
use crate::frame_type::FrameType;
use crate::frames::{Challenge, Hello, HelloAck};
use crate::types::{AuthTag, ErrorCode};

type HmacSha256 = Hmac<Sha256>;

const HELLO_LABEL: &[u8] = b"OrbitTE/1 hello\0";
const ACK_LABEL: &[u8] = b"OrbitTE/1 hello-ack\0";
const ACCESS_LABEL: &[u8] = b"OrbitTE/1 access key\0";

/// The cluster secret: the HMAC key.
///
/// Invariant: at least [`ClusterSecret::MIN_LEN`] bytes. `Debug` does not
/// show it.
#[derive(Clone)]
pub struct ClusterSecret(Vec<u8>);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterSecret({} bytes)", self.0.len())
    }
}

impl ClusterSecret {
    /// The shortest secret accepted (128 bits).
    pub const MIN_LEN: usize = 16;

    /// Checks the invariant. Use random bytes, not a password.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, AuthError> {
        let bytes = bytes.into();
        if bytes.len() < Self::MIN_LEN {
            return Err(AuthError::SecretTooShort {
                len: bytes.len(),
                min: Self::MIN_LEN,
            });
        }
        Ok(Self(bytes))
    }

    /// The key of a listener that admits only holders of `token` (a
    /// random capability the listening engine publishes in its metadata):
    /// with a cluster secret,
    /// HMAC-SHA256(secret, "OrbitTE/1 access key\0" || token), so a peer
    /// needs both the token and the secret; without one, the token itself.
    /// Both sides derive it the same way and prove it in the handshake
    /// like a cluster secret.
    pub fn access_key(cluster: Option<&Self>, token: &ListenerToken) -> Self {
        match cluster {
            None => Self(token.0.to_vec()),
            Some(secret) => {
                let mut mac = secret.mac(ACCESS_LABEL);
                mac.update(&token.0);
                Self(mac.finalize().into_bytes().to_vec())
            }
        }
    }

    fn mac(&self, label: &[u8]) -> HmacSha256 {
        // HMAC takes keys of any length; this cannot fail.
        let mut mac = match HmacSha256::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable_key(),
        };
        mac.update(label);
        mac
    }
}

/// A capability: 32 random bytes an engine publishes in its metadata
/// (`EngineBuilder::listener_token`); its listener admits only peers that
/// prove its [`ClusterSecret::access_key`]. Whoever holds the metadata
/// holds the token, so the metadata must travel over a channel the
/// operator trusts. `Debug` does not show it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ListenerToken(pub [u8; 32]);

impl std::fmt::Debug for ListenerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ListenerToken(..)")
    }
}

impl ListenerToken {
    /// Its length in bytes.
    pub const LEN: usize = 32;

    /// Lower-case hexadecimal, as metadata carries it.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads [`to_hex`](Self::to_hex)'s form.
    pub fn from_hex(text: &str) -> Result<Self, AuthError> {
        let bad = || {
            let shown: String = text.chars().take(80).collect();
            AuthError::BadToken(shown)
        };
        let bytes = text.as_bytes();
        if bytes.len() != 2 * Self::LEN {
            return Err(bad());
        }
        let mut out = [0u8; Self::LEN];
        for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            let digit = |c: u8| (c as char).to_digit(16);
            match (digit(pair[0]), digit(pair[1])) {
                (Some(h), Some(l)) => *o = (h * 16 + l) as u8,
                _ => return Err(bad()),
            }
        }
        Ok(Self(out))
    }
}

#[cold]
fn unreachable_key() -> HmacSha256 {
    // `Hmac::new_from_slice` only fails for MACs with fixed key sizes; HMAC
    // accepts every length. Fall back to an empty-keyed MAC rather than
    // panic; it can never match a proof made with the real secret.
    <HmacSha256 as Mac>::new(&Default::default())
}

/// Authentication failed, or a secret is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// We have a cluster secret and the peer sent no proof.
    #[error(
        "peer sent no authentication proof but this engine requires one; \
         configure the same cluster secret on both engines, and connect to an engine \
         that publishes a listener token with the token of its metadata"
    )]
    ProofRequired,
    /// The peer sent a proof but we have no cluster secret.
    #[error(
        "peer sent an authentication proof but this engine has no cluster secret; \
         configure the same cluster secret on both engines"
    )]
    UnexpectedProof,
    /// The proof does not match.
    #[error(
        "authentication proof does not match: the peer uses another cluster secret, or another \
         listener token than the one of its metadata (it restarted: take its metadata again)"
    )]
    WrongProof,
    /// A listener token is not 64 hexadecimal digits.
    #[error(
        "listener token {0:?} is not {len} hexadecimal digits: take it from the peer's metadata whole",
        len = 2 * ListenerToken::LEN
    )]
    BadToken(String),
    /// The configured secret is too short.
    #[error("cluster secret is {len} bytes, at least {min} are required")]
    SecretTooShort {
        /// Its length.
        len: usize,
        /// The minimum.
        min: usize,
    },
}

impl AuthError {
    /// The code of the `error` frame to send before closing.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            Self::ProofRequired => ErrorCode::AUTH_REQUIRED,
            _ => ErrorCode::AUTH_FAILED,
        }
    }
}

fn transcript_hello(hello: &Hello, out: &mut Vec<u8>) {
    // Encoding the unproven part cannot fail: the only fallible field is the
    // source id, whose invariant (<= 255 bytes) fits its length prefix.
    let _ = hello.encode_unproven(&mut Writer::new(FrameType::HELLO, out));
}

fn transcript_ack(ack: &HelloAck, out: &mut Vec<u8>) {
    let _ = ack.encode_unproven(&mut Writer::new(FrameType::HELLO_ACK, out));
}

/// The proof the initiator puts in its `hello` (its own `proof` field is not
/// covered).
pub fn hello_proof(secret: &ClusterSecret, challenge: &Challenge, hello: &Hello) -> AuthTag {
    AuthTag(
        hello_mac(secret, challenge, hello)
            .finalize()
            .into_bytes()
            .into(),
    )
}

fn hello_mac(secret: &ClusterSecret, challenge: &Challenge, hello: &Hello) -> HmacSha256 {
    let mut mac = secret.mac(HELLO_LABEL);
    mac.update(&challenge.nonce.0);
    let mut t = Vec::with_capacity(400);
    transcript_hello(hello, &mut t);
    mac.update(&t);
    mac
}

/// The proof the responder puts in its `hello-ack`.
pub fn hello_ack_proof(
    secret: &ClusterSecret,
    challenge: &Challenge,
    hello: &Hello,
    ack: &HelloAck,
) -> AuthTag {
    AuthTag(
        ack_mac(secret, challenge, hello, ack)
            .finalize()
            .into_bytes()
            .into(),
    )
}

fn ack_mac(
    secret: &ClusterSecret,
    challenge: &Challenge,
    hello: &Hello,
    ack: &HelloAck,
) -> HmacSha256 {
    let mut mac = secret.mac(ACK_LABEL);
    mac.update(&challenge.nonce.0);
    let mut t = Vec::with_capacity(800);
    transcript_hello(hello, &mut t);
    transcript_ack(ack, &mut t);
    mac.update(&t);
    mac
}

/// Responder side: checks the proof of a `hello` against the challenge we
/// sent. `secret` is our configuration (`None`: no authentication).
pub fn verify_hello(
    secret: Option<&ClusterSecret>,
    challenge: &Challenge,
    hello: &Hello,
) -> Result<(), AuthError> {
    match (secret, &hello.proof) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(AuthError::UnexpectedProof),
        (Some(_), None) => Err(AuthError::ProofRequired),
        // verify_slice compares in constant time.
        (Some(s), Some(proof)) => hello_mac(s, challenge, hello)
            .verify_slice(&proof.0)
            .map_err(|_| AuthError::WrongProof),
    }
}

/// Initiator side: checks the proof of a `hello-ack` against our challenge
/// (received) and hello (sent).
pub fn verify_hello_ack(
    secret: Option<&ClusterSecret>,
    challenge: &Challenge,
    hello: &Hello,
    ack: &HelloAck,
) -> Result<(), AuthError> {
    match (secret, &ack.proof) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(AuthError::UnexpectedProof),
        (Some(_), None) => Err(AuthError::ProofRequired),
        (Some(s), Some(proof)) => ack_mac(s, challenge, hello, ack)
            .verify_slice(&proof.0)
            .map_err(|_| AuthError::WrongProof),
    }
}
