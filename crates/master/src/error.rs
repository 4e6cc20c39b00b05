//! What the master's operations fail with.
//!
//! The state machine ([`JobError`]) and the database ([`StoreError`]) keep their own
//! types; [`MasterError`] gathers them with the refusals of the job's requests. Only the
//! gRPC handlers turn it into a [`tonic::Status`] (the `From` impl below); the control
//! loop, recovery, re-sharding and the autoscaler keep the variant, or wrap it in
//! `anyhow` with what they were doing.

use tonic::Status;

use crate::job::JobError;
use crate::store::StoreError;
use crate::tasks::ReportError;

/// A failed master operation.
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    /// The state machine refused it.
    #[error(transparent)]
    Job(#[from] JobError),
    /// A change could not be made durable: the master acknowledges nothing after it.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A request field is malformed or out of range.
    #[error("{0}")]
    InvalidRequest(String),
    /// The caller's token does not allow it.
    #[error("{0}")]
    PermissionDenied(String),
    /// The job is not in a state that allows it.
    #[error("{0}")]
    NotNow(String),
    /// Something it needs failed this time (a checkpoint, a parameter server); a retry
    /// may succeed.
    #[error("{0}")]
    Unavailable(String),
}

impl MasterError {
    /// A request field is malformed or out of range.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidRequest(msg.into())
    }

    /// The job is not in a state that allows the request.
    pub fn not_now(msg: impl Into<String>) -> Self {
        Self::NotNow(msg.into())
    }

    /// The refusal of a request made after the job left training.
    pub fn not_training() -> Self {
        Self::not_now("the job is no longer training")
    }
}

impl From<MasterError> for Status {
    fn from(e: MasterError) -> Self {
        let msg = e.to_string();
        match e {
            MasterError::Job(JobError::UnknownNode(_)) => Status::not_found(msg),
            MasterError::Job(JobError::WrongRole(_)) => Status::invalid_argument(msg),
            // A worker reporting a task it no longer holds (the master gave it away after
            // declaring the worker dead): the worker must drop the task, not retry.
            MasterError::Job(JobError::Report(ReportError::NotHeld { .. })) => {
                Status::failed_precondition(msg)
            }
            MasterError::Job(JobError::Report(_)) => Status::invalid_argument(msg),
            MasterError::Store(_) => Status::internal(msg),
            MasterError::InvalidRequest(_) => Status::invalid_argument(msg),
            MasterError::PermissionDenied(_) => Status::permission_denied(msg),
            MasterError::NotNow(_) => Status::failed_precondition(msg),
            MasterError::Unavailable(_) => Status::unavailable(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Workers act on the code: a task they lost must read as a precondition (drop it),
    /// a malformed report as an invalid argument, a database failure as internal.
    #[test]
    fn each_failure_reaches_the_caller_with_its_code() {
        let lost = MasterError::Job(JobError::Report(ReportError::NotHeld {
            task: 7,
            worker: 2,
        }));
        assert_eq!(Status::from(lost).code(), tonic::Code::FailedPrecondition);
        let unknown = MasterError::Job(JobError::UnknownNode(9));
        assert_eq!(Status::from(unknown).code(), tonic::Code::NotFound);
        let gone = MasterError::Store(StoreError::WriterGone);
        let s = Status::from(gone);
        assert_eq!(s.code(), tonic::Code::Internal);
        assert!(s.message().contains("master database"), "{}", s.message());
        assert_eq!(
            Status::from(MasterError::not_training()).code(),
            tonic::Code::FailedPrecondition
        );
    }
}
