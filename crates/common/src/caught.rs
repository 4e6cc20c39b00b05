//! Panics of a dependency, caught: some decoders (Arrow, Parquet) panic on corrupt input
//! instead of returning an error, and a corrupt file must end in an error naming it.

use std::any::Any;
use std::cell::Cell;
use std::sync::Once;

thread_local! {
    /// How many [`quiet_catch_unwind`] calls this thread is inside.
    static CATCHING: Cell<u32> = const { Cell::new(0) };
}

static HOOK: Once = Once::new();

/// Runs `f` and returns a panic inside it as its message instead of unwinding further. The
/// panic hook prints nothing for such a panic (the caller reports it as an error); panics
/// anywhere else print as before.
pub fn quiet_catch_unwind<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CATCHING.with(Cell::get) == 0 {
                previous(info);
            }
        }));
    });
    CATCHING.with(|c| c.set(c.get() + 1));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(c.get() - 1));
    outcome.map_err(|p| message(p.as_ref()))
}

fn message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_its_message_and_a_value_passes_through() {
        assert_eq!(quiet_catch_unwind(|| 7), Ok(7));
        let index = std::hint::black_box(9);
        let got = quiet_catch_unwind(|| [1, 2, 3][index]);
        assert!(got.unwrap_err().contains("index out of bounds"));
        assert_eq!(
            quiet_catch_unwind(|| panic!("offset {} out of bounds", 5)),
            Err::<(), _>("offset 5 out of bounds".to_string())
        );
    }
}
