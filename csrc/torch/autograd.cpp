// flashext autograd: the gradient formulas of the differentiable ops, as Autograd kernels in C++.
// Each op's backward is its own backward op, called through the dispatcher (so torch.compile's
// AOTAutograd traces it into the backward graph like any other op). In C++ rather than through
// torch.library.register_autograd in Python: a Python autograd kernel costs tens of microseconds a
// call, forward and backward, which an eager training step of a small model spends many times over.
//
//   flash_attn_fwd, flash_attn_varlen_fwd  save q, k, v, out and lse; the backward recomputes the
//                                          probabilities (flash_attn_bwd, flash_attn_varlen_bwd)
//   add_gelu, bias_gelu                    save their inputs; backward: add_gelu_backward,
//                                          bias_gelu_backward
// The backward ops refuse a double backward (create_graph=True) when one is asked for. A call whose
// inputs need no gradient (no_grad, inference) goes straight to the kernel, with no graph node.
// Every Function is traceable by compiled autograd: its backward only calls ops.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros_like.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace flashext_torch {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The schemas' C++ signatures (registration.cpp).
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
using GeluFwd = Tensor(const Tensor&, const Tensor&, std::string);
using AddGeluBwd = Tensor(const Tensor&, const Tensor&, const Tensor&, std::string);
using BiasGeluBwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, std::string);

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}
// Each op's handle, looked up once.
#define FLASHEXT_OP(fn, Signature, name)                                 \
  const c10::TypedOperatorHandle<Signature>& fn() {                      \
    static const auto handle = find_op<Signature>("flashext::" name);    \
    return handle;                                                       \
  }
FLASHEXT_OP(attn_fwd, AttnFwd, "flash_attn_fwd")
FLASHEXT_OP(attn_bwd, AttnBwd, "flash_attn_bwd")
FLASHEXT_OP(varlen_fwd, VarlenFwd, "flash_attn_varlen_fwd")
FLASHEXT_OP(varlen_bwd, VarlenBwd, "flash_attn_varlen_bwd")
FLASHEXT_OP(add_gelu_fwd, GeluFwd, "add_gelu")
FLASHEXT_OP(bias_gelu_fwd, GeluFwd, "bias_gelu")
FLASHEXT_OP(add_gelu_bwd, AddGeluBwd, "add_gelu_backward")
FLASHEXT_OP(bias_gelu_bwd, BiasGeluBwd, "bias_gelu_backward")
#undef FLASHEXT_OP

// The kernel below the autograd layer.
template <typename Signature, typename... Args>
auto call_below_autograd(const c10::TypedOperatorHandle<Signature>& handle, Args&&... args) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return handle.call(std::forward<Args>(args)...);
}

// Whether a call records a graph node: grad mode on and some input requiring a gradient.
bool records_grad(std::initializer_list<const Tensor*> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

// An undefined gradient for each of n non-tensor (or non-differentiable) inputs.
void append_none(variable_list& grads, int n) { grads.insert(grads.end(), n, Tensor()); }

// what: "the ... is" / "the ... are"
[[noreturn]] void refuse_double_backward(const char* what) {
  TORCH_CHECK(false, "flashext: ", what, " not differentiable (double backward is not supported)");
  __builtin_unreachable();
}

// ---- FlashAttention ------------------------------------------------------------------------

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
  static constexpr bool is_traceable = true;

  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                               std::optional<double> softmax_scale, int64_t window_left, int64_t window_right,
                               double softcap, bool align_top_left, bool deterministic, bool like_inputs) {
    auto [out, lse] = call_below_autograd(attn_fwd(), q, k, v, causal, softmax_scale, window_left, window_right,
                                          softcap, align_top_left, deterministic, like_inputs);
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
    auto [dq, dk, dv] = attn_bwd().call(dout, saved[0], saved[1], saved[2], saved[3], saved[4], dlse, o.causal,
                                        o.softmax_scale, o.window_left, o.window_right, o.softcap,
                                        ctx->saved_data["align_top_left"].toBool(), o.deterministic, o.like_inputs);
    variable_list result{dq, dk, dv};
    append_none(result, 8);  // the options
    return result;
  }
};

class FlashAttnVarlenFunction : public torch::autograd::Function<FlashAttnVarlenFunction> {
 public:
  static constexpr bool is_traceable = true;

  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                               int64_t max_seqlen_k, bool causal, std::optional<double> softmax_scale,
                               int64_t window_left, int64_t window_right, double softcap, bool validate,
                               bool deterministic, bool like_inputs) {
    auto [out, lse] = call_below_autograd(varlen_fwd(), q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                          max_seqlen_k, causal, softmax_scale, window_left, window_right, softcap,
                                          validate, deterministic, like_inputs);
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
    auto [dq, dk, dv] = varlen_bwd().call(dout, saved[0], saved[1], saved[2], saved[5], saved[6], dlse, saved[3],
                                          saved[4], ctx->saved_data["max_seqlen_q"].toInt(),
                                          ctx->saved_data["max_seqlen_k"].toInt(), o.causal, o.softmax_scale,
                                          o.window_left, o.window_right, o.softcap, o.deterministic, o.like_inputs);
    variable_list result{dq, dk, dv};
    append_none(result, 12);  // cu_seqlens_q, cu_seqlens_k and the ten options
    return result;
  }
};

// The backward ops, differentiable in name only: a double backward fails when it is asked for
// rather than returning nothing meaningful.
class FlashAttnBwdFunction : public torch::autograd::Function<FlashAttnBwdFunction> {
 public:
  template <typename Signature, typename... Args>
  static variable_list forward(AutogradContext*, const c10::TypedOperatorHandle<Signature>* handle, Args&&... args) {
    auto [dq, dk, dv] = call_below_autograd(*handle, std::forward<Args>(args)...);
    return {dq, dk, dv};
  }
  static variable_list backward(AutogradContext*, variable_list) {
    refuse_double_backward("the FlashAttention backward is");
  }
};

std::tuple<Tensor, Tensor> flash_attn_fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                   std::optional<double> softmax_scale, int64_t window_left,
                                                   int64_t window_right, double softcap, bool align_top_left,
                                                   bool deterministic, bool like_inputs) {
  if (!records_grad({&q, &k, &v})) {
    return call_below_autograd(attn_fwd(), q, k, v, causal, softmax_scale, window_left, window_right, softcap,
                               align_top_left, deterministic, like_inputs);
  }
  auto r = FlashAttnFunction::apply(q, k, v, causal, softmax_scale, window_left, window_right, softcap,
                                    align_top_left, deterministic, like_inputs);
  return {r[0], r[1]};
}

std::tuple<Tensor, Tensor> flash_attn_varlen_fwd_autograd(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal, std::optional<double> softmax_scale, int64_t window_left,
    int64_t window_right, double softcap, bool validate, bool deterministic, bool like_inputs) {
  if (!records_grad({&q, &k, &v})) {
    return call_below_autograd(varlen_fwd(), q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal, softmax_scale, window_left, window_right, softcap, validate, deterministic,
                               like_inputs);
  }
  auto r = FlashAttnVarlenFunction::apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                          softmax_scale, window_left, window_right, softcap, validate, deterministic,
                                          like_inputs);
  return {r[0], r[1]};
}

std::tuple<Tensor, Tensor, Tensor> flash_attn_bwd_autograd(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const std::optional<Tensor>& dlse, bool causal, std::optional<double> softmax_scale, int64_t window_left,
    int64_t window_right, double softcap, bool align_top_left, bool deterministic, bool like_inputs) {
  const Tensor none;
  if (!records_grad({&dout, &q, &k, &v, &out, &lse, dlse ? &*dlse : &none})) {
    return call_below_autograd(attn_bwd(), dout, q, k, v, out, lse, dlse, causal, softmax_scale, window_left,
                               window_right, softcap, align_top_left, deterministic, like_inputs);
  }
  auto r = FlashAttnBwdFunction::apply(&attn_bwd(), dout, q, k, v, out, lse, dlse, causal, softmax_scale,
                                       window_left, window_right, softcap, align_top_left, deterministic, like_inputs);
  return {r[0], r[1], r[2]};
}

std::tuple<Tensor, Tensor, Tensor> flash_attn_varlen_bwd_autograd(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const std::optional<Tensor>& dlse, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, bool causal, std::optional<double> softmax_scale, int64_t window_left,
    int64_t window_right, double softcap, bool deterministic, bool like_inputs) {
  const Tensor none;
  if (!records_grad({&dout, &q, &k, &v, &out, &lse, dlse ? &*dlse : &none})) {
    return call_below_autograd(varlen_bwd(), dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_left, window_right, softcap,
                               deterministic, like_inputs);
  }
  auto r = FlashAttnBwdFunction::apply(&varlen_bwd(), dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k,
                                       max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_left, window_right,
                                       softcap, deterministic, like_inputs);
  return {r[0], r[1], r[2]};
}

// ---- GeLU epilogues ------------------------------------------------------------------------

class AddGeluFunction : public torch::autograd::Function<AddGeluFunction> {
 public:
  static constexpr bool is_traceable = true;

  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& y, std::string approximate) {
    Tensor out = call_below_autograd(add_gelu_fwd(), x, y, approximate);
    ctx->save_for_backward({x, y});
    ctx->saved_data["approximate"] = std::move(approximate);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    // d/dx gelu(x + y) = d/dy gelu(x + y) = gelu'(x + y): one kernel, one tensor for both
    Tensor grad_z = add_gelu_bwd().call(grads[0], saved[0], saved[1], ctx->saved_data["approximate"].toStringRef());
    return {ctx->needs_input_grad(0) ? grad_z : Tensor(), ctx->needs_input_grad(1) ? grad_z : Tensor(), Tensor()};
  }
};

class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static constexpr bool is_traceable = true;

  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& bias, std::string approximate) {
    Tensor out = call_below_autograd(bias_gelu_fwd(), x, bias, approximate);
    ctx->save_for_backward({x, bias});
    ctx->saved_data["approximate"] = std::move(approximate);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_x, grad_bias] =
        bias_gelu_bwd().call(grads[0], saved[0], saved[1], ctx->saved_data["approximate"].toStringRef());
    return {ctx->needs_input_grad(0) ? grad_x : Tensor(), ctx->needs_input_grad(1) ? grad_bias : Tensor(), Tensor()};
  }
};

// The GeLU backward ops, differentiable in name only, as the attention ones.
class GeluBwdFunction : public torch::autograd::Function<GeluBwdFunction> {
 public:
  template <typename Signature>
  static variable_list forward(AutogradContext*, const c10::TypedOperatorHandle<Signature>* handle,
                               const Tensor& grad_out, const Tensor& x, const Tensor& other, std::string approximate) {
    if constexpr (std::is_same_v<Signature, AddGeluBwd>) {
      return {call_below_autograd(*handle, grad_out, x, other, std::move(approximate))};
    } else {
      auto [grad_x, grad_bias] = call_below_autograd(*handle, grad_out, x, other, std::move(approximate));
      return {grad_x, grad_bias};
    }
  }
  static variable_list backward(AutogradContext*, variable_list) {
    refuse_double_backward("the GeLU backward kernels are");
  }
};

Tensor add_gelu_autograd(const Tensor& x, const Tensor& y, std::string approximate) {
  if (!records_grad({&x, &y})) return call_below_autograd(add_gelu_fwd(), x, y, std::move(approximate));
  return AddGeluFunction::apply(x, y, std::move(approximate))[0];
}

Tensor bias_gelu_autograd(const Tensor& x, const Tensor& bias, std::string approximate) {
  if (!records_grad({&x, &bias})) return call_below_autograd(bias_gelu_fwd(), x, bias, std::move(approximate));
  return BiasGeluFunction::apply(x, bias, std::move(approximate))[0];
}

Tensor add_gelu_backward_autograd(const Tensor& grad_out, const Tensor& x, const Tensor& y, std::string approximate) {
  if (!records_grad({&grad_out, &x, &y})) {
    return call_below_autograd(add_gelu_bwd(), grad_out, x, y, std::move(approximate));
  }
  return GeluBwdFunction::apply(&add_gelu_bwd(), grad_out, x, y, std::move(approximate))[0];
}

std::tuple<Tensor, Tensor> bias_gelu_backward_autograd(const Tensor& grad_out, const Tensor& x, const Tensor& bias,
                                                       std::string approximate) {
  if (!records_grad({&grad_out, &x, &bias})) {
    return call_below_autograd(bias_gelu_bwd(), grad_out, x, bias, std::move(approximate));
  }
  auto r = GeluBwdFunction::apply(&bias_gelu_bwd(), grad_out, x, bias, std::move(approximate));
  return {r[0], r[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(flashext, Autograd, m) {
  m.impl("flash_attn_fwd", &flash_attn_fwd_autograd);
  m.impl("flash_attn_varlen_fwd", &flash_attn_varlen_fwd_autograd);
  m.impl("flash_attn_bwd", &flash_attn_bwd_autograd);
  m.impl("flash_attn_varlen_bwd", &flash_attn_varlen_bwd_autograd);
  m.impl("add_gelu", &add_gelu_autograd);
  m.impl("bias_gelu", &bias_gelu_autograd);
  m.impl("add_gelu_backward", &add_gelu_backward_autograd);
  m.impl("bias_gelu_backward", &bias_gelu_backward_autograd);
}

}  // namespace flashext_torch
