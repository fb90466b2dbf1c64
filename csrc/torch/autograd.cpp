// flashext autograd: the gradient formulas of the differentiable ops, as Autograd kernels in C++.
// Each op's backward is its own backward op, called through the dispatcher (so torch.compile's
// AOTAutograd traces it into the backward graph like any other op). In C++ rather than through
// torch.library.register_autograd in Python: a Python autograd kernel costs tens of microseconds a
// call, forward and backward, which an eager training step of a small model spends many times over.
//
//   flash_attn_fwd, flash_attn_varlen_fwd  save q, k, v, out and lse; the backward recomputes the
//                                          probabilities (flash_attn_bwd, flash_attn_varlen_bwd)
//   add_gelu, bias_gelu                    save their inputs; backward: add_gelu_backward,
//                                          bias_gelu_backward, which refuse a double backward
// The forward-only ops refuse a backward in Python (attention.py, softmax.py).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/zeros_like.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

namespace flashext_torch {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using at::Tensor;

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// An undefined gradient for each of n non-tensor (or non-differentiable) inputs.
void append_none(variable_list& grads, int n) { grads.insert(grads.end(), n, Tensor()); }

// ---- FlashAttention ------------------------------------------------------------------------

using AttnFwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, bool, std::optional<double>,
                                          int64_t, int64_t, double, bool, bool, bool);
using AttnBwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                   const Tensor&, const Tensor&, const std::optional<Tensor>&, bool,
                                                   std::optional<double>, int64_t, int64_t, double, bool, bool, bool);
using VarlenFwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                            int64_t, int64_t, bool, std::optional<double>, int64_t, int64_t, double,
                                            bool, bool, bool);
using VarlenBwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                     const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                                     const Tensor&, const Tensor&, int64_t, int64_t, bool,
                                                     std::optional<double>, int64_t, int64_t, double, bool, bool);

// The options every attention op shares, kept for the backward.
struct AttnOptions {
  bool causal;
  std::optional<double> softmax_scale;
  int64_t window_left, window_right;
  double softcap;
  bool deterministic, like_inputs;

  void save(AutogradContext* ctx) const {
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["softmax_scale"] = softmax_scale;
    ctx->saved_data["window_left"] = window_left;
    ctx->saved_data["window_right"] = window_right;
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["deterministic"] = deterministic;
    ctx->saved_data["like_inputs"] = like_inputs;
  }
  static AttnOptions load(AutogradContext* ctx) {
    const auto& d = ctx->saved_data;
    return {d.at("causal").toBool(), d.at("softmax_scale").toOptional<double>(), d.at("window_left").toInt(),
            d.at("window_right").toInt(), d.at("softcap").toDouble(), d.at("deterministic").toBool(),
            d.at("like_inputs").toBool()};
  }
};

// The incoming gradients of (out, lse): a missing dout is zeros, a missing dlse stays absent.
std::pair<Tensor, std::optional<Tensor>> attention_grads(const variable_list& grads, const Tensor& out) {
  Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(out);
  std::optional<Tensor> dlse = grads[1].defined() ? std::optional<Tensor>(grads[1]) : std::nullopt;
  return {dout, dlse};
}

class FlashAttnFunction : public torch::autograd::Function<FlashAttnFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                               std::optional<double> softmax_scale, int64_t window_left, int64_t window_right,
                               double softcap, bool align_top_left, bool deterministic, bool like_inputs) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<AttnFwd>("flashext::flash_attn_fwd");
    auto [out, lse] = fwd.call(q, k, v, causal, softmax_scale, window_left, window_right, softcap, align_top_left,
                               deterministic, like_inputs);
    ctx->save_for_backward({q, k, v, out, lse});
    AttnOptions{causal, softmax_scale, window_left, window_right, softcap, deterministic, like_inputs}.save(ctx);
    ctx->saved_data["align_top_left"] = align_top_left;
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const AttnOptions o = AttnOptions::load(ctx);
    auto [dout, dlse] = attention_grads(grads, saved[3]);
    static const auto bwd = op<AttnBwd>("flashext::flash_attn_bwd");
    auto [dq, dk, dv] = bwd.call(dout, saved[0], saved[1], saved[2], saved[3], saved[4], dlse, o.causal,
                                 o.softmax_scale, o.window_left, o.window_right, o.softcap,
                                 ctx->saved_data["align_top_left"].toBool(), o.deterministic, o.like_inputs);
    variable_list result{dq, dk, dv};
    append_none(result, 8);
    return result;
  }
};

class FlashAttnVarlenFunction : public torch::autograd::Function<FlashAttnVarlenFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                               int64_t max_seqlen_k, bool causal, std::optional<double> softmax_scale,
                               int64_t window_left, int64_t window_right, double softcap, bool validate,
                               bool deterministic, bool like_inputs) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<VarlenFwd>("flashext::flash_attn_varlen_fwd");
    auto [out, lse] = fwd.call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                               softmax_scale, window_left, window_right, softcap, validate, deterministic,
                               like_inputs);
    ctx->save_for_backward({q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse});
    AttnOptions{causal, softmax_scale, window_left, window_right, softcap, deterministic, like_inputs}.save(ctx);
    ctx->saved_data["max_seqlen_q"] = max_seqlen_q;
    ctx->saved_data["max_seqlen_k"] = max_seqlen_k;
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const AttnOptions o = AttnOptions::load(ctx);
    auto [dout, dlse] = attention_grads(grads, saved[5]);
    static const auto bwd = op<VarlenBwd>("flashext::flash_attn_varlen_bwd");
    auto [dq, dk, dv] = bwd.call(dout, saved[0], saved[1], saved[2], saved[5], saved[6], dlse, saved[3], saved[4],
                                 ctx->saved_data["max_seqlen_q"].toInt(), ctx->saved_data["max_seqlen_k"].toInt(),
                                 o.causal, o.softmax_scale, o.window_left, o.window_right, o.softcap,
                                 o.deterministic, o.like_inputs);
    variable_list result{dq, dk, dv};
    append_none(result, 12);  // cu_seqlens_q, cu_seqlens_k and the ten options
    return result;
  }
};

std::tuple<Tensor, Tensor> flash_attn_fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                   std::optional<double> softmax_scale, int64_t window_left,
                                                   int64_t window_right, double softcap, bool align_top_left,
                                                   bool deterministic, bool like_inputs) {
  auto r = FlashAttnFunction::apply(q, k, v, causal, softmax_scale, window_left, window_right, softcap,
                                    align_top_left, deterministic, like_inputs);
  return {r[0], r[1]};
}

std::tuple<Tensor, Tensor> flash_attn_varlen_fwd_autograd(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal, std::optional<double> softmax_scale, int64_t window_left,
    int64_t window_right, double softcap, bool validate, bool deterministic, bool like_inputs) {
  auto r = FlashAttnVarlenFunction::apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                          softmax_scale, window_left, window_right, softcap, validate, deterministic,
                                          like_inputs);
  return {r[0], r[1]};
}

// ---- GeLU epilogues ------------------------------------------------------------------------

using GeluFwd = Tensor(const Tensor&, const Tensor&, std::string);
using AddGeluBwd = Tensor(const Tensor&, const Tensor&, const Tensor&, std::string);
using BiasGeluBwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, std::string);

[[noreturn]] void refuse_double_backward() {
  TORCH_CHECK(false, "flashext: the GeLU backward kernels are not differentiable (double backward is not supported)");
  __builtin_unreachable();
}

class AddGeluFunction : public torch::autograd::Function<AddGeluFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& y, std::string approximate) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<GeluFwd>("flashext::add_gelu");
    Tensor out = fwd.call(x, y, approximate);
    ctx->save_for_backward({x, y});
    ctx->saved_data["approximate"] = approximate;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    static const auto bwd = op<AddGeluBwd>("flashext::add_gelu_backward");
    // d/dx gelu(x + y) = d/dy gelu(x + y) = gelu'(x + y): one kernel, one tensor for both
    Tensor grad_z = bwd.call(grads[0], saved[0], saved[1], ctx->saved_data["approximate"].toStringRef());
    return {ctx->needs_input_grad(0) ? grad_z : Tensor(), ctx->needs_input_grad(1) ? grad_z : Tensor(), Tensor()};
  }
};

class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& bias, std::string approximate) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<GeluFwd>("flashext::bias_gelu");
    Tensor out = fwd.call(x, bias, approximate);
    ctx->save_for_backward({x, bias});
    ctx->saved_data["approximate"] = approximate;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    static const auto bwd = op<BiasGeluBwd>("flashext::bias_gelu_backward");
    auto [grad_x, grad_bias] = bwd.call(grads[0], saved[0], saved[1], ctx->saved_data["approximate"].toStringRef());
    return {ctx->needs_input_grad(0) ? grad_x : Tensor(), ctx->needs_input_grad(1) ? grad_bias : Tensor(), Tensor()};
  }
};

// The backward ops: differentiable in name only, so that a double backward fails when it is asked for
// rather than silently returning no gradient.
class AddGeluBackwardFunction : public torch::autograd::Function<AddGeluBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const Tensor& grad_out, const Tensor& x, const Tensor& y,
                               std::string approximate) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto bwd = op<AddGeluBwd>("flashext::add_gelu_backward");
    return {bwd.call(grad_out, x, y, approximate)};
  }
  static variable_list backward(AutogradContext*, variable_list) { refuse_double_backward(); }
};

class BiasGeluBackwardFunction : public torch::autograd::Function<BiasGeluBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const Tensor& grad_out, const Tensor& x, const Tensor& bias,
                               std::string approximate) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto bwd = op<BiasGeluBwd>("flashext::bias_gelu_backward");
    auto [grad_x, grad_bias] = bwd.call(grad_out, x, bias, approximate);
    return {grad_x, grad_bias};
  }
  static variable_list backward(AutogradContext*, variable_list) { refuse_double_backward(); }
};

Tensor add_gelu_autograd(const Tensor& x, const Tensor& y, std::string approximate) {
  return AddGeluFunction::apply(x, y, std::move(approximate))[0];
}
Tensor bias_gelu_autograd(const Tensor& x, const Tensor& bias, std::string approximate) {
  return BiasGeluFunction::apply(x, bias, std::move(approximate))[0];
}
Tensor add_gelu_backward_autograd(const Tensor& grad_out, const Tensor& x, const Tensor& y, std::string approximate) {
  return AddGeluBackwardFunction::apply(grad_out, x, y, std::move(approximate))[0];
}
std::tuple<Tensor, Tensor> bias_gelu_backward_autograd(const Tensor& grad_out, const Tensor& x, const Tensor& bias,
                                                       std::string approximate) {
  auto r = BiasGeluBackwardFunction::apply(grad_out, x, bias, std::move(approximate));
  return {r[0], r[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(flashext, Autograd, m) {
  m.impl("flash_attn_fwd", &flash_attn_fwd_autograd);
  m.impl("flash_attn_varlen_fwd", &flash_attn_varlen_fwd_autograd);
  m.impl("add_gelu", &add_gelu_autograd);
  m.impl("bias_gelu", &bias_gelu_autograd);
  m.impl("add_gelu_backward", &add_gelu_backward_autograd);
  m.impl("bias_gelu_backward", &bias_gelu_backward_autograd);
}

}  // namespace flashext_torch
