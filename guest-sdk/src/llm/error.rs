//! [`LlmError`]: how a model call or a tool loop of [`llm`](crate::llm) fails.

/// Why a call of [`llm::Client`](crate::llm::Client) failed. It reaches the agent as
/// [`Error::Llm`](crate::Error::Llm). In every case but [`LlmError::TurnLimit`] the
/// call's key is left uncommitted (its claim released): nothing the model answered was
/// recorded, every earlier step stays committed, and running the agent again calls the
/// model again for that turn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The run was not granted the environment variable that holds the API key (or
    /// it is empty). The key comes from the run's grants, never from the component.
    #[error(
        "the model's API key is missing: environment variable {var} is not granted to the run \
         (or is empty)"
    )]
    MissingKey {
        /// The variable's name (`OPENAI_API_KEY`, say).
        var: String,
    },
    /// An environment variable naming the endpoint holds no usable URL.
    #[error("environment variable {var} is not an http:// or https:// URL: {value:?}")]
    BadEndpoint {
        /// The variable's name.
        var: String,
        /// What it held.
        value: String,
    },
    /// The model answered with an error status that retrying does not cure (400, 401,
    /// 404, ...).
    #[error("the model at {url} refused the request with status {status}: {body}")]
    Status {
        /// The endpoint called.
        url: String,
        /// The status code.
        status: u16,
        /// The start of the response body, for the reason.
        body: String,
    },
    /// Every attempt the retry policy allows failed with 429, a 5xx or a transport
    /// error.
    #[error("the model call {key} gave up after {attempts} attempts; the last: {last}")]
    GaveUp {
        /// The call's key.
        key: String,
        /// Attempts made, across instances.
        attempts: u32,
        /// What the last attempt got.
        last: String,
    },
    /// The response is not what the provider's API answers: not JSON, cut short, or
    /// missing a field the client needs.
    #[error("malformed model response to {key}: {detail}")]
    Malformed {
        /// The call's key.
        key: String,
        /// What was wrong.
        detail: String,
    },
    /// The response body is larger than the client's limit
    /// ([`Client::max_response_bytes`](crate::llm::Client::max_response_bytes)) or
    /// than the host keeps as a step's result.
    #[error("the model's response to {key} is too large: {detail}")]
    TooLarge {
        /// The call's key.
        key: String,
        /// The size and the limit.
        detail: String,
    },
    /// The model still asked for tools after the turn limit of the tool loop.
    #[error("conversation {conversation} still calls tools after {turns} model turns")]
    TurnLimit {
        /// The conversation's id.
        conversation: String,
        /// The limit that was reached.
        turns: u32,
    },
}
