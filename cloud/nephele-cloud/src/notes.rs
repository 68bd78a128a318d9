//! What the regions ask of the federation actor: the messages, defined apart from it so
//! a region holds an [`actix::Recipient`] for each, not the federation's address. The
//! federation implements [`actix::Handler`] for them; the API sends the same
//! `CreateJoinToken` and `DeleteDevice`.

use actix::prelude::*;
use nephele_api::JoinTokenView;

use crate::api_error::ApiError;
use crate::scheduler::PoolWork;

/// A region's word on what one pool agent must run (level-triggered: the whole list).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetPoolWork {
    pub agent: String,
    pub work: PoolWork,
}

#[derive(Message)]
#[rtype(result = "Result<JoinTokenView, ApiError>")]
pub struct CreateJoinToken {
    pub region: Option<String>,
    pub ttl_s: Option<u64>,
}

#[derive(Message)]
#[rtype(result = "Result<(), ApiError>")]
pub struct DeleteDevice(pub String);
