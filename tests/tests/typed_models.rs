//! A model with the shape of an exported one (three typed inputs, one of them an i64
//! scalar, a symbolic batch; two outputs of different types), pushed as it is and with
//! its inputs fixed at push, deployed to a real agent and asked with named typed
//! tensors, in JSON and in the binary form.

use nephele_e2e::*;
use serde_json::json;

#[test]
fn a_model_with_typed_inputs_is_pushed_with_input_specs_and_served_by_name() {
    let model = nephele_runtime::synthetic::typed_example();
    let cloud = Cloud::start("typed-models").expect("cloud");
    let edge = Edge::start(
        &cloud,
        "cam-1",
        "eu-west",
        &["--profile", "rpi5-8gb", "--label", "site=lab"],
        &[],
    )
    .expect("edge agent");
    let http = cloud.client();

    // As exported, the batch of `scale` is a name, `N`: it loads with N symbolic (but
    // `offset` must then be sent with every request).
    let (code, any) = http
        .raw(
            "PUT",
            &format!("{}/v1/models/typed-any?wait=true", cloud.api),
            &model,
        )
        .expect("push");
    assert_eq!(code, 201, "{any}");
    assert_eq!(any["inputs"][1]["shape"], json!([-1, 4]), "{any}");
    // A spec naming an input the model does not have is refused at once.
    let (code, unknown) = http
        .raw(
            "PUT",
            &format!("{}/v1/models/typed?input=bias%3D1", cloud.api),
            &model,
        )
        .expect("push");
    assert_eq!(code, 400, "{unknown}");
    assert!(
        unknown.to_string().contains("ids, scale, offset"),
        "{unknown}"
    );

    // With the batch bounded (N..2) and the scalar folded in, it loads on the typed path.
    let (code, view) = http
        .raw(
            "PUT",
            &format!(
                "{}/v1/models/typed?wait=true&input=scale%3DN..2%2C4&input=offset%3Dscalar%3Ai64%3D3",
                cloud.api
            ),
            &model,
        )
        .expect("push");
    assert_eq!(code, 201, "{view}");
    assert_eq!(view["format"], "onnx-graph", "{view}");
    assert_eq!(view["inputs"][0]["dtype"], "i64", "{view}");
    assert_eq!(view["outputs"][0]["dtype"], "i64", "{view}");
    assert_eq!(view["input_specs"][0], "scale=N..2,4", "{view}");
    assert_eq!(view["input_specs"][1], "offset=scalar:i64=3", "{view}");

    cloud
        .post(
            "/v1/deployments",
            &json!({"name": "typed", "model": "typed", "selector": "site=lab",
                    "offload": false}),
        )
        .expect("deploy");
    cloud
        .wait_for("/v1/deployments/typed", "typed ready on the edge", |v| {
            v["ready_devices"] == 1
        })
        .expect("ready");

    let url = format!("{}/v1/infer/typed", edge.endpoint);
    let agent = Http::new(None);
    let request = json!({"inputs": {
        "ids": {"dtype": "i64", "shape": [1, 4], "data": [1, 2, 3, -4]},
        "scale": {"dtype": "f32", "shape": [1, 4], "data": [0.5, 0.5, 2.0, 1.0]},
    }});
    let (code, reply) = agent.raw_json("POST", &url, &request).expect("infer");
    assert_eq!(code, 200, "{reply}");
    assert_eq!(reply["outputs"]["doubled"]["dtype"], "i64", "{reply}");
    assert_eq!(
        reply["outputs"]["doubled"]["data"],
        json!([2.0, 4.0, 6.0, -8.0])
    );
    // f32(ids) · scale + 3 (the folded offset).
    assert_eq!(
        reply["outputs"]["scaled"]["data"],
        json!([3.5, 4.0, 9.0, -1.0])
    );
    assert_eq!(reply["where"], "local", "{reply}");

    // The binary form: a JSON header, then the values as little-endian bytes in the
    // order the header lists them; asked for, the answer comes back the same way.
    let header = serde_json::to_vec(&json!({"inputs": [
        {"name": "ids", "dtype": "i64", "shape": [1, 4], "binary_data_size": 32},
        {"name": "scale", "dtype": "f32", "shape": [1, 4], "binary_data_size": 16},
    ], "binary_outputs": true}))
    .expect("header");
    let mut body = header.clone();
    body.extend([1i64, 2, 3, -4].iter().flat_map(|v| v.to_le_bytes()));
    body.extend([0.5f32, 0.5, 2.0, 1.0].iter().flat_map(|v| v.to_le_bytes()));
    let (code, length, answer) = agent
        .post_binary(&url, header.len(), &body)
        .expect("binary infer");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&answer));
    let length = length.expect("the answer says where its header ends");
    let meta: serde_json::Value = serde_json::from_slice(&answer[..length]).expect("header");
    // Outputs in name order: doubled (i64 × 4), then scaled (f32 × 4).
    assert_eq!(meta["outputs"][0]["name"], "doubled", "{meta}");
    assert_eq!(meta["outputs"][1]["binary_data_size"], 16, "{meta}");
    let data = &answer[length..];
    let doubled: Vec<i64> = data[..32]
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    let scaled: Vec<f32> = data[32..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    assert_eq!(doubled, vec![2, 4, 6, -8]);
    assert_eq!(scaled, vec![3.5, 4.0, 9.0, -1.0]);
    // A body whose sizes do not add up is a 400 that says so.
    let (code, _, answer) = agent
        .post_binary(&url, header.len(), &body[..body.len() - 4])
        .expect("binary infer");
    assert_eq!(code, 400);
    assert!(
        String::from_utf8_lossy(&answer).contains("scale"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // Bad requests are refused one by one, each saying what is wrong.
    for (body, says) in [
        (
            json!({"inputs": {"ids": {"dtype": "i32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                              "scale": {"dtype": "f32", "shape": [1, 4], "data": [1, 1, 1, 1]}}}),
            "i64",
        ),
        (
            json!({"inputs": {"ids": {"dtype": "i64", "shape": [1, 4], "data": [1, 2, 3, 4]}}}),
            "missing",
        ),
        (
            json!({"shape": [1, 4], "data": [1, 2, 3, 4]}),
            "named typed inputs",
        ),
        (
            json!({"inputs": {"ids": {"dtype": "i64"}}}),
            "invalid typed request",
        ),
        // Above the bound given at push: refused before the model allocates anything.
        (
            json!({"inputs": {"ids": {"dtype": "i64", "shape": [1, 4], "data": [1, 2, 3, 4]},
                              "scale": {"dtype": "f32", "shape": [3, 4], "data": vec![1.0; 12]}}}),
            "N = 3, above the 2",
        ),
    ] {
        let (code, reply) = agent.raw_json("POST", &url, &body).expect("infer");
        assert_eq!(code, 400, "{body} → {reply}");
        assert!(reply.to_string().contains(says), "{body} → {reply}");
    }
    // And the agent still answers after them, at the bound too.
    let (code, reply) = agent.raw_json("POST", &url, &request).expect("infer");
    assert_eq!(code, 200, "{reply}");
    let two = json!({"inputs": {
        "ids": {"dtype": "i64", "shape": [1, 4], "data": [1, 2, 3, -4]},
        "scale": {"dtype": "f32", "shape": [2, 4], "data": [1, 1, 1, 1, 0, 0, 0, 0]},
    }});
    let (code, reply) = agent.raw_json("POST", &url, &two).expect("infer");
    assert_eq!(code, 200, "{reply}");
    assert_eq!(
        reply["outputs"]["scaled"]["data"],
        json!([4.0, 5.0, 6.0, -1.0, 3.0, 3.0, 3.0, 3.0])
    );
    let status = cloud.get("/v1/deployments/typed").expect("status");
    println!("{status}");

    // With the batch axis N in every input and output (and bounded at 3 rows), the
    // agent finds it at load and batches requests that wait for a slot; each still
    // gets its own rows.
    let (code, view) = http
        .raw(
            "PUT",
            &format!(
                "{}/v1/models/typed-batch?wait=true&input=ids%3DN%2C4&input=scale%3DN..3%2C4&input=offset%3Dscalar%3Ai64%3D3",
                cloud.api
            ),
            &model,
        )
        .expect("push");
    assert_eq!(code, 201, "{view}");
    cloud
        .post(
            "/v1/deployments",
            &json!({"name": "typed-batch", "model": "typed-batch", "selector": "site=lab",
                    "offload": false, "max_queue": 1000, "slo_ms": 10000}),
        )
        .expect("deploy");
    cloud
        .wait_for("/v1/deployments/typed-batch", "typed-batch ready", |v| {
            v["ready_devices"] == 1
        })
        .expect("ready");
    let url = format!("{}/v1/infer/typed-batch", edge.endpoint);
    let (threads, rounds) = (16usize, 12usize);
    let mut sent = 0u64;
    let mut largest = 0u64;
    for round in 0..rounds {
        let sizes: Vec<u64> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let url = url.clone();
                    scope.spawn(move || {
                        let rows = 1 + (t + round) % 2;
                        let ids: Vec<i64> =
                            (0..4 * rows as i64).map(|v| v * (t as i64 + 1)).collect();
                        let scale: Vec<f32> =
                            (0..4 * rows).map(|v| v as f32 * 0.5 + t as f32).collect();
                        let body = json!({"inputs": {
                            "ids": {"dtype": "i64", "shape": [rows, 4], "data": ids},
                            "scale": {"dtype": "f32", "shape": [rows, 4], "data": scale},
                        }});
                        let (code, reply) = Http::new(None)
                            .raw_json("POST", &url, &body)
                            .expect("infer");
                        assert_eq!(code, 200, "{reply}");
                        let doubled: Vec<f64> = ids.iter().map(|v| 2.0 * *v as f64).collect();
                        let scaled: Vec<f64> = ids
                            .iter()
                            .zip(&scale)
                            .map(|(i, s)| (*i as f32 * s + 3.0) as f64)
                            .collect();
                        assert_eq!(
                            reply["outputs"]["doubled"]["data"],
                            json!(doubled),
                            "{reply}"
                        );
                        assert_eq!(reply["outputs"]["scaled"]["data"], json!(scaled), "{reply}");
                        assert_eq!(reply["outputs"]["scaled"]["shape"], json!([rows, 4]));
                        reply["batch_size"].as_u64().expect("batch_size")
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("client"))
                .collect()
        });
        sent += threads as u64;
        largest = largest.max(sizes.into_iter().max().unwrap_or(0));
        if largest > 1 && round >= 2 {
            break;
        }
    }
    let status = agent
        .request("GET", &format!("{}/v1/status", edge.endpoint), None)
        .expect("status");
    let row = status["deployments"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == "typed-batch")
        .cloned()
        .expect("typed-batch in the agent's status");
    println!("batching after {sent} requests: {}", row["batching"]);
    assert_eq!(row["batching"]["axis"], "N", "{row}");
    assert_eq!(row["batching"]["stats"]["requests"], json!(sent), "{row}");
    assert!(
        largest > 1,
        "{sent} concurrent requests on 2 slots never shared a batch: {row}"
    );
    // The first deployment's model has no batch axis (ids is [1, 4]).
    let first = status["deployments"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == "typed")
        .cloned()
        .expect("typed");
    assert!(first["batching"].is_null(), "{first}");
}
