//! What is issued and held (docs/design.md §4.2, "One identity manager"): every identity this
//! agent issues for a pod, early or on demand, goes through [`queue::Queue`] by priority.

pub mod queue;
