//! The error every model operation returns: a bad config, unreadable or mismatched weights, bad input.

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("{0}")]
    Io(String),
    #[error("bad checkpoint: {0}")]
    Format(String),
    #[error("bad input: {0}")]
    Input(String),
    /// The device had no memory left for an allocation (a smaller micro-batch may fit).
    #[error("out of device memory: {0}")]
    OutOfMemory(String),
    /// Handing finished gradients to a reduction between data-parallel ranks failed (the
    /// reduction stopped, or a model declared a parameter final and then added to it).
    #[error("gradient reduction: {0}")]
    Reduction(String),
}
