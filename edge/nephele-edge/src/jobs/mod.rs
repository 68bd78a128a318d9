//! Job members on a pool agent: the processes the control plane's region scheduler
//! placed on this node, each run under a supervisor so that it outlives the agent.
//!
//! * [`core`]: `JobRunnerCore`, the pure decision (what to start, stop, forget), with
//!   time as an argument.
//! * [`runner`]: `JobRunner`, the shell: a driver thread that spawns supervisors,
//!   signals process groups, reads status files and persists the core's records.
//! * [`supervisor`]: the hidden `supervise` subcommand each member runs under.
//! * [`files`]: paths, the status file format, the member environment, /proc.
//!
//! Member lifecycle, per (job, attempt, member) key. "Listed" means the latest
//! `DesiredState::jobs` names the key; a key is started at most once, ever (the start
//! is on disk before the supervisor is spawned), so only a new attempt runs again.
//!
//! | phase          | on                                   | next            | action / report                    |
//! |----------------|--------------------------------------|-----------------|------------------------------------|
//! | (unknown)      | listed                               | starting        | start the supervisor               |
//! | (retired)      | listed again                         | as it was       | reported again, never restarted    |
//! | starting       | supervisor writes `running`          | running         | `Running{pid}` (not reported before) |
//! | starting       | `failed_to_start`, or no supervisor  | failed to start | `FailedToStart(why)`               |
//! | starting       | not listed                           | starting        | stopped as soon as it runs         |
//! | running        | not listed                           | stopping        | SIGTERM to its group               |
//! | stopping       | grace_ms elapsed                     | stopping        | SIGKILL to its group (once)        |
//! | running/stopping | status `exited`                    | exited          | `Exited{code, signal}`             |
//! | running/stopping | supervisor and member gone, no status | exited       | `Exited{None, None}` (lost)        |
//! | stopping       | listed again                         | stopping        | not restarted                      |
//! | exited/failed  | listed                               | exited/failed   | reported; never restarted          |
//! | exited/failed  | not listed                           | retired         | reported 120 s more; log kept      |
//! | retired        | 7 days, or 100 newer retired members | retired         | log, status and own dir deleted    |
//! | retired        | 4096 newer retired members           | forgotten       | record dropped                     |
//!
//! On disk, under `<data_dir>/jobs/` (`<job>` escaped by [`files::safe_job_name`]):
//!
//! | path                                  | what                                           |
//! |---------------------------------------|------------------------------------------------|
//! | `state.json`                          | the core's records and the boot id (atomic)    |
//! | `<job>/<attempt>/member-<n>.log`      | the member's stdout and stderr, appended       |
//! | `<job>/<attempt>/member-<n>.status`   | the supervisor's JSON status (atomic)          |
//! | `<job>/<attempt>/member-<n>/`         | its working directory, when the launch names none |
//!
//! An agent restart (even kill -9) leaves members running; the next agent reads the
//! state file and each live member's status file, adopts what still runs and takes the
//! exit status of what ended meanwhile. Stopping the agent does not stop members: the
//! desired state does (or a signal to a supervisor, which forwards it).

pub mod core;
pub mod files;
pub mod runner;
pub mod supervisor;

pub use self::core::{JobRunnerCore, MemberKey, Retention};
pub use self::runner::{JobRunner, JobRunnerConfig, LogChunk, MAX_LOG_CHUNK};
pub use self::supervisor::{SuperviseArgs, SupervisorCommand};
