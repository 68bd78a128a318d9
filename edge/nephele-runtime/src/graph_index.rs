//! Who writes and who reads each value of an ONNX graph, and which values are
//! constants: what the graph rewrites (`fold_affine`, `fuse_activations`) match on.

use std::collections::{HashMap, HashSet};

use tract_onnx::pb::{GraphProto, NodeProto, TensorProto};

/// An index of one graph (not its subgraphs, though their reads are counted).
pub(crate) struct GraphIndex<'a> {
    /// The node writing each value, by index.
    pub producer: HashMap<&'a str, usize>,
    /// How many times each value is read by a node.
    pub uses: HashMap<&'a str, usize>,
    /// The graph's outputs.
    pub outputs: HashSet<&'a str>,
    /// See [`graph_constants`].
    pub constants: HashMap<&'a str, &'a TensorProto>,
}

impl<'a> GraphIndex<'a> {
    pub fn new(graph: &'a GraphProto) -> GraphIndex<'a> {
        let mut producer = HashMap::new();
        for (index, node) in graph.node.iter().enumerate() {
            for output in &node.output {
                producer.insert(output.as_str(), index);
            }
        }
        let mut uses = HashMap::new();
        count_uses(graph, &mut uses);
        GraphIndex {
            producer,
            uses,
            outputs: graph.output.iter().map(|o| o.name.as_str()).collect(),
            constants: graph_constants(graph),
        }
    }

    /// Whether `value` is read exactly once (by the node at hand) and is not an output
    /// of the graph: a rewrite may then absorb the node writing it.
    pub fn read_once(&self, value: &str) -> bool {
        !self.outputs.contains(value) && self.uses.get(value).copied() == Some(1)
    }
}

/// The graph's constants by name: its initializers (except those also listed as graph
/// inputs, which a caller may override) and the tensors of its `Constant` nodes.
pub(crate) fn graph_constants(graph: &GraphProto) -> HashMap<&str, &TensorProto> {
    let mut constants: HashMap<&str, &TensorProto> = HashMap::new();
    for node in &graph.node {
        if node.op_type == "Constant" && is_onnx_domain(node) && node.output.len() == 1 {
            if let Some(tensor) = node
                .attribute
                .iter()
                .find(|a| a.name == "value")
                .and_then(|a| a.t.as_ref())
            {
                constants.insert(node.output[0].as_str(), tensor);
            }
        }
    }
    let inputs: HashSet<&str> = graph.input.iter().map(|i| i.name.as_str()).collect();
    for tensor in &graph.initializer {
        if !inputs.contains(tensor.name.as_str()) {
            constants.insert(tensor.name.as_str(), tensor);
        }
    }
    constants
}

/// Counts how many times each value is read by a node, in this graph and in the
/// subgraphs of its nodes (a body may read a value of the graph around it).
pub(crate) fn count_uses<'a>(graph: &'a GraphProto, uses: &mut HashMap<&'a str, usize>) {
    for node in &graph.node {
        for input in &node.input {
            if !input.is_empty() {
                *uses.entry(input.as_str()).or_default() += 1;
            }
        }
        for attribute in &node.attribute {
            for subgraph in attribute.g.iter().chain(attribute.graphs.iter()) {
                count_uses(subgraph, uses);
            }
        }
    }
}

/// Every value `node` reads: its inputs, then the values of the graph around it that
/// its subgraphs (an `If`'s branches, a `Loop`'s body) read by name without computing
/// or declaring them.
pub(crate) fn node_reads(node: &NodeProto) -> Vec<&str> {
    let mut reads: Vec<&str> = node
        .input
        .iter()
        .filter(|i| !i.is_empty())
        .map(String::as_str)
        .collect();
    for attribute in &node.attribute {
        for subgraph in attribute.g.iter().chain(attribute.graphs.iter()) {
            for name in outer_reads(subgraph) {
                if !reads.contains(&name) {
                    reads.push(name);
                }
            }
        }
    }
    reads
}

/// The names `graph` (a subgraph) reads from the graphs around it.
pub(crate) fn outer_reads(graph: &GraphProto) -> Vec<&str> {
    let mut local: HashSet<&str> = graph
        .input
        .iter()
        .map(|i| i.name.as_str())
        .chain(graph.initializer.iter().map(|t| t.name.as_str()))
        .collect();
    let mut reads = Vec::new();
    for node in &graph.node {
        for name in node_reads(node) {
            if !local.contains(name) && !reads.contains(&name) {
                reads.push(name);
            }
        }
        local.extend(node.output.iter().map(String::as_str));
    }
    for output in &graph.output {
        let name = output.name.as_str();
        if !local.contains(name) && !reads.contains(&name) {
            reads.push(name);
        }
    }
    reads
}

/// Renames, in `node`'s subgraphs (at any depth), every read of a value of the graphs
/// around them that `renamed` maps, as a rewrite that renames that graph's values must.
/// ONNX forbids a subgraph's own names to shadow outer ones, so a name `renamed` maps is
/// an outer read wherever a subgraph uses it.
pub(crate) fn rename_outer_reads(node: &mut NodeProto, renamed: &HashMap<String, String>) {
    let rename = |name: &mut String| {
        if let Some(new) = renamed.get(name.as_str()) {
            *name = new.clone();
        }
    };
    for attribute in &mut node.attribute {
        for subgraph in attribute.g.iter_mut().chain(attribute.graphs.iter_mut()) {
            for inner in &mut subgraph.node {
                inner.input.iter_mut().for_each(rename);
                rename_outer_reads(inner, renamed);
            }
            subgraph.output.iter_mut().for_each(|o| rename(&mut o.name));
        }
    }
}

/// Whether a node is of the default ONNX operator set.
pub(crate) fn is_onnx_domain(node: &NodeProto) -> bool {
    node.domain.is_empty() || node.domain == "ai.onnx"
}
