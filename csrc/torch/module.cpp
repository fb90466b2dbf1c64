// flashext._C: the Python module that loads the ops into torch.ops.flashext. It holds no ops
// (they are reached through the dispatcher), only what the build contains and the switch that
// allows the Hopper kernels.
#include <Python.h>
#include <cuda_runtime_api.h>

#include "flashext/attention.h"
#include "flashext/common.h"

namespace {

// _C.arch_supported(major, minor) -> bool: whether this build runs on that compute capability.
PyObject* arch_supported(PyObject*, PyObject* args) {
  int major = 0, minor = 0;
  if (!PyArg_ParseTuple(args, "ii", &major, &minor)) return nullptr;
  return PyBool_FromLong(flashext::arch_supported(flashext::compiled_cuda_archs(), major, minor));
}

// _C.bwd_smem_bytes(head_dim, max_smem_per_block) -> int: the shared memory per block the attention
// backward needs at that head dim within that budget, 0 when none of its tiles fits.
PyObject* bwd_smem_bytes(PyObject*, PyObject* args) {
  int head_dim = 0, budget = 0;
  if (!PyArg_ParseTuple(args, "ii", &head_dim, &budget)) return nullptr;
  if (budget <= 0) return PyLong_FromLong(0);  // (0 would mean "this device's", which needs a GPU)
  return PyLong_FromLong(flashext::flash_bwd_smem_bytes(head_dim, budget));
}

// _C.set_hopper_kernels(mode) -> int: which calls the Hopper kernels serve, 0 none, 1 where they
// are faster, 2 every call they can take (flashext/common.h); returns the previous mode.
// _C.hopper_kernels() -> int: the mode.
PyObject* set_hopper_kernels(PyObject*, PyObject* args) {
  int mode = 1;
  if (!PyArg_ParseTuple(args, "i", &mode)) return nullptr;
  if (mode < 0 || mode > 2) {
    PyErr_SetString(PyExc_ValueError, "set_hopper_kernels: mode must be 0, 1 or 2");
    return nullptr;
  }
  return PyLong_FromLong(int(flashext::set_hopper_kernels(flashext::HopperKernels(mode))));
}

PyObject* hopper_kernels(PyObject*, PyObject*) { return PyLong_FromLong(int(flashext::hopper_kernels())); }

PyMethodDef flashext_methods[] = {
    {"arch_supported", arch_supported, METH_VARARGS,
     "arch_supported(major, minor) -> bool: whether this build holds kernels for that device"},
    {"bwd_smem_bytes", bwd_smem_bytes, METH_VARARGS,
     "bwd_smem_bytes(head_dim, max_smem_per_block) -> int: shared memory the attention backward needs "
     "there (0: no tiles fit)"},
    {"set_hopper_kernels", set_hopper_kernels, METH_VARARGS,
     "set_hopper_kernels(mode) -> int: which calls the Hopper kernels serve (0 none, 1 where faster, 2 all "
     "they can take); the previous mode"},
    {"hopper_kernels", hopper_kernels, METH_NOARGS, "hopper_kernels() -> int: the mode set_hopper_kernels sets"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef flashext_module = {
    PyModuleDef_HEAD_INIT,
    "_C",
    "flashext CUDA kernels; ops are registered under torch.ops.flashext",
    -1,
    flashext_methods,
};

}  // namespace

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  PyObject* module = PyModule_Create(&flashext_module);
  if (module == nullptr) return nullptr;
  if (PyModule_AddStringConstant(module, "cuda_archs", flashext::compiled_cuda_archs()) < 0 ||
      PyModule_AddIntConstant(module, "cuda_runtime_version", CUDART_VERSION) < 0 ||
      PyModule_AddStringConstant(module, "kernels", flashext::compiled_kernels()) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
