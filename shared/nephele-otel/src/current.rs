//! The trace context of the request a task is serving, so that code deep in the
//! request's path (an offload several calls down) finds its parent without every
//! function passing it along: set with [`scope`] around the request's future, read
//! with [`current`]. Outside any scope there is none.

use std::future::Future;

use crate::context::TraceContext;

tokio::task_local! {
    static CURRENT: Option<TraceContext>;
}

/// Runs `future` with `context` as its current trace context.
pub async fn scope<F: Future>(context: Option<TraceContext>, future: F) -> F::Output {
    CURRENT.scope(context, future).await
}

/// The current trace context, if the running task is inside a [`scope`] that has one.
pub fn current() -> Option<TraceContext> {
    CURRENT.try_with(|context| *context).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scope_gives_its_context_to_what_it_runs_and_no_further() {
        let context = TraceContext {
            trace_id: [9; 16],
            span_id: [8; 8],
            sampled: true,
        };
        assert_eq!(current(), None);
        let seen = scope(Some(context), async {
            tokio::task::yield_now().await;
            current()
        })
        .await;
        assert_eq!(seen, Some(context));
        assert_eq!(current(), None);
    }
}
