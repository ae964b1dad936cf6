//! Unit tests' view of what xtc logs: a `tracing` subscriber that counts events by level, made
//! the thread's default with `tracing::subscriber::with_default`.

use std::sync::{
    atomic::{AtomicUsize, Ordering::SeqCst},
    Arc,
};

/// Counts the events logged at WARN (`[0]`), at DEBUG (`[1]`) and at ERROR (`[2]`) on the
/// thread it is the default subscriber of.
pub(crate) struct Levels(pub(crate) Arc<[AtomicUsize; 3]>);

impl Levels {
    /// A subscriber and the counts it fills.
    pub(crate) fn new() -> (Levels, Arc<[AtomicUsize; 3]>) {
        // A second dispatcher, registered for good: while the scoped one is the only one,
        // tracing-core caches a callsite first hit on another thread (no subscriber) as
        // `never`, and this subscriber misses its events.
        static KEEP: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
        KEEP.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
        let counts = Arc::new([
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        ]);
        (Levels(counts.clone()), counts)
    }
}

impl tracing::Subscriber for Levels {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let i = match *event.metadata().level() {
            tracing::Level::WARN => 0,
            tracing::Level::DEBUG => 1,
            tracing::Level::ERROR => 2,
            _ => return,
        };
        self.0[i].fetch_add(1, SeqCst);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
