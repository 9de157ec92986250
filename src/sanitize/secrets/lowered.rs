//! The lowered copy the keyword pass of the secret detectors searches.
//!
//! Place: under [`super::find`], once per text it scans (outgoing arguments,
//! every result text).
//!
//! Invariants: same length and offsets as the text, only ASCII capitals
//! changed; the buffer kept between calls is at most
//! [`MAX_KEPT_LOWERED`] bytes, so a thread holds no more than that after a
//! long text.

use std::cell::RefCell;

thread_local! {
    /// The lowered copy's buffer, kept between calls on this thread: a long
    /// text is lowered without a new allocation (and its fresh pages) per call.
    static LOWERED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Largest buffer kept for the next call; a longer one is given back.
const MAX_KEPT_LOWERED: usize = 1 << 20;

/// Runs `f` on the bytes of `text` with its ASCII letters lowered (every
/// other byte as it is, so offsets into them are offsets into `text`). The
/// lowering is branch-free, so it runs in vector registers.
pub(super) fn with_lowered<R>(text: &str, f: impl FnOnce(&[u8]) -> R) -> R {
    let lower = |b: u8| b | (u8::from(b.is_ascii_uppercase()) << 5);
    LOWERED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffer) => {
            buffer.clear();
            buffer.extend(text.bytes().map(lower));
            let out = f(&buffer);
            if buffer.capacity() > MAX_KEPT_LOWERED {
                *buffer = Vec::new();
            }
            out
        }
        // Only if `f` itself searched again: a copy of its own.
        Err(_) => f(&text.bytes().map(lower).collect::<Vec<u8>>()),
    })
}
