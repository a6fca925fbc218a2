// The Python module `tapeformer` (pybind11; docs/python.md): a trained model in a notebook — its attention
// weights, per-head contexts and gate gradients as numpy arrays, decoding, head masking and the head study
// of `tapeformer heads`, each through the library functions the CLI calls, so the numbers are the CLI's.
//
// Every call that computes releases the GIL and holds the model's own lock instead: Python threads may run
// other work meanwhile, and two threads never use one model at once. C++ errors reach Python as exceptions
// with the CLI's messages (std::invalid_argument -> ValueError, std::runtime_error -> RuntimeError).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/blas.h"
#include "tapeformer/data/batch.h"
#include "tapeformer/data/text.h"
#include "tapeformer/metrics/bleu.h"
#include "tapeformer/model_settings.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/study/head_formats.h"
#include "tapeformer/study/head_ids.h"
#include "tapeformer/study/heads.h"
#include "tapeformer/study/provenance.h"

namespace py = pybind11;
using namespace tf;

namespace {

// What one teacher-forced pass showed, copied out of the tape while the GIL is released: per attention
// (E layers, then D, then A) the probes asked for, batch row 0.
struct ForwardResult {
    std::vector<std::string> src, tgt_in, tgt_out;  // tokens (src empty for a decoder-only model)
    double loss = 0;                                // NLL summed over the target tokens
    struct Attention {
        HeadKind kind;
        int layer;
        std::int64_t H, Tq, Tk, D;
        std::vector<float> weights, context, gate_grad;  // (H, Tq, Tk), (H, Tq, D), (H, Tq)
    };
    std::vector<Attention> attentions;
};

class Model {
public:
    explicit Model(const std::string& dir) : bundle_(load_model_dir(dir)), dir_(dir) {}

    Transformer& model() { return *bundle_.model; }
    const ModelConfig& config() const { return bundle_.model->config; }
    ModelBundle& bundle() { return bundle_; }
    const std::string& dir() const { return dir_; }
    std::mutex& lock() { return lock_; }

private:
    ModelBundle bundle_;
    std::string dir_;
    std::mutex lock_;
};

// Runs `fn` with the GIL released and the model locked.
template <class Fn>
auto compute(Model& m, Fn&& fn) {
    py::gil_scoped_release released;
    std::lock_guard<std::mutex> held(m.lock());
    return fn();
}

const Tokenizer& side_tokenizer(Model& m, const std::string& side) {
    if (side == "source") return *m.bundle().tokenizers.source;
    if (side == "target") return *m.bundle().tokenizers.target;
    throw std::invalid_argument("side must be 'source' or 'target', got '" + side + "'");
}

// The pair as a study reads it (study_pairs: too long refused, a decoder-only model's text as the target).
Example one_pair(Model& m, const std::string& src, const std::optional<std::string>& tgt) {
    const bool lm = m.config().decoder_only();
    if (lm && tgt) throw std::invalid_argument(m.dir() + " is a decoder-only model, which reads one text: give it as src, without tgt");
    std::string target;
    if (lm) target = src;
    else if (tgt) target = *tgt;
    else {  // the model's own greedy translation, as `tapeformer attention` does without --tgt
        DecodeOptions greedy;
        target = translate_lines(m.model(), m.bundle().tokenizers, {src}, greedy, 4096).at(0);
        if (target.empty()) throw std::invalid_argument("the model translates '" + src + "' as nothing: give tgt");
    }
    return study_pairs(m.model(), m.bundle().tokenizers, parallel_text({src}, {target})).examples.at(0);
}

ForwardResult forward(Model& m, const Example& pair, bool weights, bool context, bool gate_grad) {
    const TokenizerPair& tok = m.bundle().tokenizers;
    const ModelConfig& c = m.config();
    ForwardResult out;
    if (!c.decoder_only()) {
        for (std::int32_t id : pair.src) out.src.push_back(tok.source->id_to_piece(id));
        out.src.push_back(tok.source->id_to_piece(c.eos_id));
    }
    out.tgt_in.push_back(tok.target->id_to_piece(c.bos_id));
    for (std::int32_t id : pair.tgt) {
        out.tgt_in.push_back(tok.target->id_to_piece(id));
        out.tgt_out.push_back(tok.target->id_to_piece(id));
    }
    out.tgt_out.push_back(tok.target->id_to_piece(c.eos_id));

    for (const auto& p : m.model().parameters()) {  // the pass's gradients only
        Tensor t = p.tensor;
        if (t.has_grad()) t.zero_grad();
    }
    const Batch b = make_batch({pair}, {0});
    const std::vector<GatedAttention> gated = gated_pass(m.model(), b, 0, &out.loss);
    for (const GatedAttention& at : gated) {
        ForwardResult::Attention a{at.kind, at.layer, at.weights.size(1), at.weights.size(2), at.weights.size(3),
                                   at.context.size(3), {}, {}, {}};
        if (weights) a.weights.assign(at.weights.data(), at.weights.data() + at.weights.numel());
        if (context) a.context.assign(at.context.data(), at.context.data() + at.context.numel());
        if (gate_grad) {
            const real* g = std::as_const(at.gate).grad();  // (1, H, Tq, 1)
            if (g) a.gate_grad.assign(g, g + at.gate.numel());
            else a.gate_grad.assign(std::size_t(at.gate.numel()), 0.0f);
        }
        out.attentions.push_back(std::move(a));
    }
    return out;
}

py::array_t<float> array(const std::vector<float>& values, std::vector<py::ssize_t> shape) {
    py::array_t<float> a(shape);
    std::copy(values.begin(), values.end(), a.mutable_data());
    return a;
}

// {"E": [per layer], "D": [...], "A": [...]} of one probe, each array (H, ...) as `shape` says.
py::dict by_kind(const ForwardResult& r, const std::vector<float> ForwardResult::Attention::*probe,
                 const std::function<std::vector<py::ssize_t>(const ForwardResult::Attention&)>& shape) {
    py::dict out;
    for (const ForwardResult::Attention& a : r.attentions) {
        const std::string kind(1, to_char(a.kind));
        if (!out.contains(kind)) out[kind.c_str()] = py::list();
        out[kind.c_str()].cast<py::list>().append(array(a.*probe, shape(a)));
    }
    return out;
}

py::object setting_value(const Setting<ModelConfig>& s, const ModelConfig& c) {
    const std::string text = s.get(c);
    switch (s.type) {
        case SettingType::Integer: return py::int_(std::stoll(text));
        case SettingType::Real: return py::float_(std::stod(text));
        case SettingType::Bool: return py::bool_(text == "true");
        default: return py::str(text);
    }
}

}  // namespace

PYBIND11_MODULE(tapeformer, mod) {
    mod.doc() = "tapeformer: a trained model's attention, gradients per head, decoding and head studies (docs/python.md)";

    mod.def("set_threads", [](int n) { set_threads(n); }, py::arg("n"),
            "Threads for OpenMP and OpenBLAS together (n <= 0: all cores), as the CLI's --threads");
    mod.def("bleu", [](const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
                return corpus_bleu(hyps, refs).score;
            },
            py::arg("hypotheses"), py::arg("references"), py::call_guard<py::gil_scoped_release>(),
            "Corpus BLEU (sacreBLEU's 13a tokenization), as `tapeformer eval` prints it");

    py::class_<Model>(mod, "Model", "A model directory written by `tapeformer train` (tapeformer.load)")
        .def_property_readonly("path", &Model::dir)
        .def_property_readonly("config", [](Model& m) {
                py::dict d;
                for (const Setting<ModelConfig>& s : model_settings()) d[s.key.c_str()] = setting_value(s, m.config());
                return d;
            }, "The model's settings, by the keys of its metadata (d_model, heads, ...)")
        .def("encode", [](Model& m, const std::string& text, const std::string& side) {
                return compute(m, [&] { return side_tokenizer(m, side).encode(text); });
            }, py::arg("text"), py::arg("side") = "source", "Token ids of text (without BOS/EOS)")
        .def("pieces", [](Model& m, const std::string& text, const std::string& side) {
                return compute(m, [&] { return side_tokenizer(m, side).pieces(text); });
            }, py::arg("text"), py::arg("side") = "source", "The tokens of text, as strings")
        .def("forward", [](Model& m, const std::string& src, const std::optional<std::string>& tgt,
                           const std::vector<std::string>& probes) {
                bool weights = false, context = false, gate_grad = false;
                for (const std::string& p : probes) {
                    if (p == "weights") weights = true;
                    else if (p == "context") context = true;
                    else if (p == "gate_grad") gate_grad = true;
                    else throw std::invalid_argument("probes: each is 'weights', 'context' or 'gate_grad', got '" + p + "'");
                }
                const ForwardResult r = compute(m, [&] { return forward(m, one_pair(m, src, tgt), weights, context, gate_grad); });
                py::dict out;
                py::dict tokens;
                if (!m.config().decoder_only()) tokens["src"] = r.src;
                tokens["tgt_in"] = r.tgt_in;
                tokens["tgt_out"] = r.tgt_out;
                out["tokens"] = tokens;
                out["loss"] = r.loss;
                using A = ForwardResult::Attention;
                if (weights) out["weights"] = by_kind(r, &A::weights, [](const A& a) { return std::vector<py::ssize_t>{a.H, a.Tq, a.Tk}; });
                if (context) out["context"] = by_kind(r, &A::context, [](const A& a) { return std::vector<py::ssize_t>{a.H, a.Tq, a.D}; });
                if (gate_grad) {
                    out["gate_grad"] = by_kind(r, &A::gate_grad, [](const A& a) { return std::vector<py::ssize_t>{a.H, a.Tq}; });
                    // the pair's token importance per head: mean over its queries of |gate gradient|
                    py::dict importance;
                    for (const A& a : r.attentions) {
                        std::vector<float> mean(std::size_t(a.H), 0.0f);
                        for (std::int64_t h = 0; h < a.H; ++h) {
                            double s = 0;
                            for (std::int64_t t = 0; t < a.Tq; ++t) s += std::fabs(double(a.gate_grad[std::size_t(h * a.Tq + t)]));
                            mean[std::size_t(h)] = float(s / double(a.Tq));
                        }
                        const std::string kind(1, to_char(a.kind));
                        if (!importance.contains(kind)) importance[kind.c_str()] = py::list();
                        importance[kind.c_str()].cast<py::list>().append(array(mean, {a.H}));
                    }
                    out["importance"] = importance;
                }
                return out;
            },
            py::arg("src"), py::arg("tgt") = py::none(), py::arg("probes") = std::vector<std::string>{"weights", "context", "gate_grad"},
            "One teacher-forced pass of the pair (dropout off; without tgt, the model's greedy translation) with\n"
            "the loss's backward. Returns a dict: tokens {src, tgt_in, tgt_out}, loss (NLL summed over the target\n"
            "tokens) and, by probe, {'E': [...], 'D': [...], 'A': [...]} with one array per layer: weights\n"
            "(H, Tq, Tk), context (H, Tq, D: each head's sum_j a_ij v_j), gate_grad (H, Tq: dL/dxi per query) and\n"
            "importance (H: the pair's mean |dL/dxi| over its queries)")
        .def("translate", [](Model& m, const std::vector<std::string>& sources, int beam, double length_penalty,
                             std::int64_t batch_tokens) {
                return compute(m, [&] {
                    if (m.config().decoder_only())
                        throw std::invalid_argument(m.dir() + " is a decoder-only model: it continues text (tapeformer generate), it does not translate");
                    DecodeOptions o;
                    o.beam = beam;
                    o.length_penalty = length_penalty;
                    return translate_lines(m.model(), m.bundle().tokenizers, sources, o, batch_tokens);
                });
            },
            py::arg("sources"), py::arg("beam") = 1, py::arg("length_penalty") = 1.0, py::arg("batch_tokens") = 4096,
            "Translations of the sentences: greedy (beam=1) or beam search, as `tapeformer translate`")
        .def("nll", [](Model& m, const std::vector<std::string>& sources, const std::vector<std::string>& targets,
                       std::int64_t batch_tokens) {
                return compute(m, [&] {
                    const EncodedCorpus c = study_pairs(m.model(), m.bundle().tokenizers, parallel_text(sources, targets));
                    return teacher_forced_loss(m.model(), c.examples, batch_tokens, 0.0).nll;
                });
            },
            py::arg("sources"), py::arg("targets"), py::arg("batch_tokens") = 4096,
            "Teacher-forced NLL per target token of the pairs (dropout off), as `tapeformer eval` reports it")
        .def("mask_heads", [](Model& m, const std::vector<std::string>& heads) {
                compute(m, [&] {
                    std::string spec;
                    for (const std::string& h : heads) spec += (spec.empty() ? "" : ",") + h;
                    mask_heads(m.model(), spec.empty() ? std::vector<HeadId>{} : parse_head_list(spec, m.config()));
                    return 0;
                });
            },
            py::arg("heads"),
            "Close these heads' gates ('E:0:1', ...; KIND:layer:head, 0-based) and open every other, as --mask-heads;\n"
            "an empty list opens them all")
        .def("masked_heads", [](Model& m) {
                return compute(m, [&] {
                    std::vector<std::string> names;
                    for (const HeadId& h : masked_heads(m.model())) names.push_back(h.str());
                    return names;
                });
            })
        .def("heads", [](Model& m, const std::vector<std::string>& sources, const std::optional<std::vector<std::string>>& targets,
                         const std::string& granularity, const std::string& loss, double label_smoothing, bool raw,
                         std::int64_t batch_tokens) {
                const std::string json = compute(m, [&] {
                    const bool lm = m.config().decoder_only();
                    if (lm == targets.has_value())
                        throw std::invalid_argument(lm ? "a decoder-only model reads one text: give sources alone"
                                                       : "targets are required (the references of the sources)");
                    if (loss != "nll" && loss != "smoothed") throw std::invalid_argument("loss must be nll or smoothed, got '" + loss + "'");
                    HeadStudyOptions o;
                    o.granularity = parse_granularity(granularity);
                    o.smoothed = loss == "smoothed";
                    o.label_smoothing = label_smoothing;
                    o.normalise = !raw;
                    o.batch_tokens = batch_tokens;
                    o.punctuation = punctuation_ids(m.bundle().tokenizers);
                    const EncodedCorpus c = study_pairs(m.model(), m.bundle().tokenizers, parallel_text(sources, lm ? sources : *targets));
                    const HeadReport report = study_heads(m.model(), c.examples, o);
                    return heads_json(report, study_provenance(m.bundle(), m.dir()));
                });
                const py::object parsed = py::module_::import("json").attr("loads")(json);
                return py::object(parsed["heads"]);
            },
            py::arg("sources"), py::arg("targets") = py::none(), py::arg("granularity") = "token", py::arg("loss") = "nll",
            py::arg("label_smoothing") = 0.1, py::arg("raw") = false, py::arg("batch_tokens") = 4096,
            "The study of `tapeformer heads` on these pairs: a list with a dict per head, the entries of\n"
            "heads.json's 'heads' (importance, gradient norms, attention statistics)");

    mod.def("load", [](const std::string& path) {
                py::gil_scoped_release released;
                return std::make_unique<Model>(path);
            },
            py::arg("path"), "Load a model directory written by `tapeformer train` (or one of its checkpoints)");
}
