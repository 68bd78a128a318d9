//! Golden bytes for every message: the encoding is a contract between agents and control
//! planes of different versions. If a change here is intended, bump PROTOCOL_VERSION and
//! re-bless with `NEPHELE_BLESS=1 cargo test --release -p nephele-proto --test golden`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use nephele_proto::*;

fn tensor() -> Tensor {
    Tensor {
        shape: vec![1, 2],
        data: vec![0.5, -1.0],
    }
}

fn error() -> ErrorFrame {
    ErrorFrame::new(ErrorCode::Overloaded, "busy")
}

fn manifest() -> ModelManifest {
    ModelManifest {
        name: "m".into(),
        format: "onnx".into(),
        created_unix: 1_700_000_000,
        inputs: vec![TensorSpec {
            name: "input".into(),
            shape: vec![-1, 64],
            dtype: "f32".into(),
        }],
        outputs: vec![TensorSpec {
            name: "logits".into(),
            shape: vec![-1, 10],
            dtype: "f32".into(),
        }],
        validation: "360 labelled rows".into(),
        variants: vec![
            ModelVariant {
                name: "full".into(),
                kind: VariantKind::Full,
                precision: "fp32".into(),
                sha256: [0xab; 32],
                size: 70_000,
                accuracy: Some(0.98),
                min_cosine: Some(1.0),
                flops: 34_000,
            },
            ModelVariant {
                name: "split@h".into(),
                kind: VariantKind::Split {
                    cut: "h".into(),
                    activation_bytes: 512,
                    head_flops: 16_000,
                    tail_flops: 18_000,
                    tail_sha256: [0xcd; 32],
                    tail_size: 40_000,
                },
                precision: "fp32".into(),
                sha256: [0xef; 32],
                size: 30_000,
                accuracy: None,
                min_cosine: Some(0.9999),
                flops: 34_000,
            },
        ],
        state: vec![StateBinding {
            input: "h".into(),
            output: "h_next".into(),
        }],
    }
}

fn member_status(state: MemberState) -> JobMemberStatus {
    JobMemberStatus {
        job: "team-a/train".into(),
        attempt: 1,
        member: 0,
        state,
    }
}

fn assignment() -> Assignment {
    Assignment {
        deployment: "d".into(),
        model: SignedManifest {
            manifest: vec![1, 2, 3],
            signature: vec![9; 4],
        },
        variant: "full".into(),
        slo_ms: 5,
        offload: true,
        max_queue: 64,
        hard_example_threshold: Some(0.6),
    }
}

/// (name, encoded payload) for one sample of every message and enum variant.
fn samples() -> Vec<(&'static str, Vec<u8>)> {
    let e = |m: &dyn erased::Encode| m.encode();
    vec![
        (
            "JoinRequest",
            e(&JoinRequest {
                protocol_version: PROTOCOL_VERSION,
                token_id: "id".into(),
                token_secret: "s".into(),
                name: "pi-1".into(),
                role: "edge".into(),
                csr_der: vec![0x30, 0x01],
                labels: BTreeMap::from([("site".to_string(), "lab".to_string())]),
            }),
        ),
        (
            "JoinResponse::Accepted",
            e(&JoinResponse::Accepted(JoinAccepted {
                agent_id: "pi-1".into(),
                region: "eu".into(),
                certificate_der: vec![1],
                ca_der: vec![2],
                manifest_signing_key: vec![3; 4],
            })),
        ),
        ("JoinResponse::Refused", e(&JoinResponse::Refused(error()))),
        (
            "AgentMessage::Hello",
            e(&AgentMessage::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                agent_version: "0.1.0".into(),
                role: "edge".into(),
                profile_name: "rpi5-8gb".into(),
                profile_toml: "x".into(),
                models_cached: vec![[7; 32]],
                local_endpoint: "127.0.0.1:8700".into(),
                node: NodeReport {
                    address: "10.0.0.7".into(),
                    gpus: vec![GpuReport {
                        index: 0,
                        model: "NVIDIA A100-SXM4-80GB".into(),
                        uuid: "GPU-1".into(),
                        mig: vec![MigReport {
                            profile: "1g.10gb".into(),
                            uuid: "MIG-2".into(),
                        }],
                    }],
                },
                jobs: vec![member_status(MemberState::Running {
                    pid: 42,
                    started_unix: 1_700_000_000,
                })],
            })),
        ),
        (
            "AgentMessage::Heartbeat",
            e(&AgentMessage::Heartbeat(Heartbeat {
                seq: 3,
                uptime_ms: 1000,
                applied_generation: 42,
                rss_bytes: 9_000_000,
                deployments: vec![
                    DeploymentTelemetry {
                        deployment: "d".into(),
                        phase: DeploymentPhase::Ready,
                        variant: "full".into(),
                        served_local: 10,
                        served_offloaded: 2,
                        failed: 0,
                        queue_len: 1,
                        p50_us: 120,
                        p99_us: 900,
                        service_us: 85,
                        model_sha256: [7; 32],
                    },
                    DeploymentTelemetry::idle("e", DeploymentPhase::Failed("bad".into())),
                    DeploymentTelemetry::idle("f", DeploymentPhase::Pending),
                    DeploymentTelemetry::idle("g", DeploymentPhase::Downloading),
                ],
                link: LinkReport {
                    rtt_us: 2_500,
                    bandwidth_bps: 40_000_000,
                },
                jobs: vec![
                    member_status(MemberState::Stopping { pid: 42 }),
                    member_status(MemberState::Exited {
                        code: Some(0),
                        signal: None,
                        finished_unix: 1_700_000_100,
                    }),
                    member_status(MemberState::Exited {
                        code: None,
                        signal: Some(15),
                        finished_unix: 1_700_000_101,
                    }),
                    member_status(MemberState::FailedToStart("no such file".into())),
                ],
            })),
        ),
        (
            "AgentMessage::Notice",
            e(&AgentMessage::Notice(InterruptionNotice {
                seconds: 120,
                source: "SIGUSR1".into(),
            })),
        ),
        (
            "CloudMessage::Welcome",
            e(&CloudMessage::Welcome(Welcome {
                agent_id: "pi-1".into(),
                region: "eu".into(),
                heartbeat_interval_ms: 1000,
            })),
        ),
        (
            "CloudMessage::DesiredState",
            e(&CloudMessage::DesiredState(DesiredState {
                generation: 7,
                assignments: vec![assignment()],
                jobs: vec![JobLaunch {
                    job: "team-a/train".into(),
                    attempt: 2,
                    member: 3,
                    argv: vec!["python3".into(), "train.py".into()],
                    env: vec![("RANK".into(), "3".into())],
                    working_dir: String::new(),
                    grace_ms: 30_000,
                }],
            })),
        ),
        ("CloudMessage::Refused", e(&CloudMessage::Refused(error()))),
        ("ModelManifest", e(&manifest())),
        (
            "StreamRequest::FetchChunk",
            e(&StreamRequest {
                protocol_version: PROTOCOL_VERSION,
                body: RequestBody::FetchChunk {
                    sha256: [1; 32],
                    offset: 262_144,
                    len: CHUNK_BYTES,
                },
            }),
        ),
        (
            "StreamRequest::Infer",
            e(&StreamRequest {
                protocol_version: PROTOCOL_VERSION,
                body: RequestBody::Infer(InferRequest {
                    deployment: "d".into(),
                    request_id: 99,
                    input: Payload::Tensor(tensor()),
                    stage: InferStage::Whole,
                    trace: None,
                }),
            }),
        ),
        (
            "StreamRequest::Infer typed",
            e(&StreamRequest {
                protocol_version: PROTOCOL_VERSION,
                body: RequestBody::Infer(InferRequest {
                    deployment: "vad".into(),
                    request_id: 101,
                    input: Payload::Typed(vec![
                        TypedTensor {
                            name: "input".into(),
                            dtype: DType::F32,
                            shape: vec![1, 2],
                            data: [0.5f32, -1.0]
                                .iter()
                                .flat_map(|v| v.to_le_bytes())
                                .collect(),
                        },
                        TypedTensor {
                            name: "sr".into(),
                            dtype: DType::I64,
                            shape: vec![],
                            data: 16_000i64.to_le_bytes().to_vec(),
                        },
                    ]),
                    stage: InferStage::Whole,
                    trace: None,
                }),
            }),
        ),
        (
            "StreamRequest::Infer tail",
            e(&StreamRequest {
                protocol_version: PROTOCOL_VERSION,
                body: RequestBody::Infer(InferRequest {
                    deployment: "d".into(),
                    request_id: 100,
                    input: Payload::Tensor(tensor()),
                    stage: InferStage::Tail {
                        variant: "split@relu1".into(),
                    },
                    trace: Some(TraceParent {
                        trace_id: [0x4b; 16],
                        span_id: [0x07; 8],
                        flags: 1,
                    }),
                }),
            }),
        ),
        (
            "StreamRequest::JobLogs",
            e(&StreamRequest {
                protocol_version: PROTOCOL_VERSION,
                body: RequestBody::JobLogs {
                    job: "team-a/train".into(),
                    attempt: 1,
                    member: 0,
                    offset: 4096,
                    max_bytes: 65_536,
                },
            }),
        ),
        (
            "StreamResponse::Chunk",
            e(&StreamResponse::Chunk {
                total_size: 3,
                data: vec![1, 2, 3],
            }),
        ),
        (
            "StreamResponse::Inferred",
            e(&StreamResponse::Inferred(InferResponse {
                request_id: 99,
                output: Payload::Tensor(tensor()),
                computed_by: "pool-1".into(),
                compute_us: 250,
            })),
        ),
        (
            "StreamResponse::Logs",
            e(&StreamResponse::Logs {
                data: b"step 1\n".to_vec(),
                size: 4103,
                finished: false,
            }),
        ),
        (
            "StreamResponse::Error overloaded",
            e(&StreamResponse::Error(ErrorFrame::overloaded("shed", 250))),
        ),
        (
            "StreamResponse::Error",
            e(&StreamResponse::Error(ErrorFrame::new(
                ErrorCode::VersionMismatch,
                "v",
            ))),
        ),
    ]
}

mod erased {
    pub trait Encode {
        fn encode(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Vec<u8> {
            nephele_proto::encode_payload(self).expect("encodes")
        }
    }
}

#[test]
fn encodings_match_the_golden_file() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden.txt");
    let rendered: String = samples()
        .iter()
        .map(|(name, bytes)| format!("{name} {}\n", hex::encode(bytes)))
        .collect();
    if std::env::var_os("NEPHELE_BLESS").is_some() {
        std::fs::write(&path, &rendered).expect("write golden file");
    }
    let golden = std::fs::read_to_string(&path).expect("tests/golden.txt exists (bless it once)");
    for (expected, actual) in golden.lines().zip(rendered.lines()) {
        assert_eq!(actual, expected, "wire encoding changed");
    }
    assert_eq!(golden.lines().count(), rendered.lines().count());
}

#[test]
fn every_sample_round_trips() {
    let frame = encode_frame(&manifest()).unwrap();
    let mut decoder = FrameDecoder::new(MAX_FRAME_BYTES);
    // Byte by byte: a frame split anywhere is reassembled.
    for byte in &frame[..frame.len() - 1] {
        decoder.push(std::slice::from_ref(byte));
        assert_eq!(decoder.next_frame::<ModelManifest>().unwrap(), None);
    }
    decoder.push(&frame[frame.len() - 1..]);
    assert_eq!(
        decoder.next_frame::<ModelManifest>().unwrap(),
        Some(manifest())
    );
    assert_eq!(decoder.pending(), 0);
    let bytes = encode_payload(&assignment()).unwrap();
    assert_eq!(decode_payload::<Assignment>(&bytes).unwrap(), assignment());
}

#[test]
fn oversized_and_trailing_frames_are_refused() {
    let mut decoder = FrameDecoder::new(16);
    decoder.push(&17u32.to_be_bytes());
    assert!(matches!(
        decoder.next_frame::<Tensor>(),
        Err(FrameError::TooLarge { len: 17, max: 16 })
    ));
    assert!(
        decoder.next_frame::<Tensor>().is_err(),
        "a failed decoder stays failed"
    );
    let mut bytes = encode_payload(&tensor()).unwrap();
    bytes.push(0);
    assert!(matches!(
        decode_payload::<Tensor>(&bytes),
        Err(FrameError::TrailingBytes(1))
    ));
}

proptest::proptest! {
    #[test]
    fn hostile_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let _ = decode_payload::<AgentMessage>(&bytes);
        let _ = decode_payload::<CloudMessage>(&bytes);
        let _ = decode_payload::<StreamRequest>(&bytes);
        let _ = decode_payload::<StreamResponse>(&bytes);
        let _ = decode_payload::<JoinRequest>(&bytes);
        let mut decoder = FrameDecoder::new(1024);
        decoder.push(&bytes);
        while let Ok(Some(_)) = decoder.next_frame::<AgentMessage>() {}
    }

    #[test]
    fn huge_length_claims_do_not_allocate(len in 1u64..u64::MAX) {
        // A varint length prefix claiming a vast vector must fail cleanly, not abort.
        let mut bytes = vec![0u8]; // AgentMessage::Hello
        bytes.extend_from_slice(&[0x01]); // protocol_version
        bytes.push(0xfd); // u64 varint marker
        bytes.extend_from_slice(&len.to_le_bytes());
        let _ = decode_payload::<AgentMessage>(&bytes);
    }
}

#[test]
fn tensors_validate_their_shape() {
    assert!(tensor().validate().is_ok());
    assert!(Tensor {
        shape: vec![2, 2],
        data: vec![0.0; 3]
    }
    .validate()
    .is_err());
    assert!(Tensor {
        shape: vec![u32::MAX, u32::MAX, u32::MAX],
        data: vec![]
    }
    .validate()
    .is_err());
}
