//! A model with the shape of an exported one (three typed inputs, one of them an i64
//! scalar, a symbolic batch; two outputs of different types), pushed as it is with its
//! inputs fixed at push, deployed to a real agent and asked with named typed tensors.

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

    // As exported, the batch of `scale` is unknown: refused, with the flag to give.
    let (code, refused) = http
        .raw(
            "PUT",
            &format!("{}/v1/models/typed?wait=true", cloud.api),
            &model,
        )
        .expect("push");
    assert_eq!(code, 400, "{refused}");
    assert!(refused.to_string().contains("--input scale="), "{refused}");
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

    // With the batch fixed and the scalar folded in, it loads on the typed path.
    let (code, view) = http
        .raw(
            "PUT",
            &format!(
                "{}/v1/models/typed?wait=true&input=scale%3D1%2C4&input=offset%3Dscalar%3Ai64%3D3",
                cloud.api
            ),
            &model,
        )
        .expect("push");
    assert_eq!(code, 201, "{view}");
    assert_eq!(view["format"], "onnx-graph", "{view}");
    assert_eq!(view["inputs"][0]["dtype"], "i64", "{view}");
    assert_eq!(view["outputs"][0]["dtype"], "i64", "{view}");
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
    ] {
        let (code, reply) = agent.raw_json("POST", &url, &body).expect("infer");
        assert_eq!(code, 400, "{body} → {reply}");
        assert!(reply.to_string().contains(says), "{body} → {reply}");
    }
    // And the agent still answers after them.
    let (code, reply) = agent.raw_json("POST", &url, &request).expect("infer");
    assert_eq!(code, 200, "{reply}");
    let status = cloud.get("/v1/deployments/typed").expect("status");
    println!("{status}");
}
