#!/usr/bin/env python3
# The patches below embed llama.cpp source lines verbatim; they cannot be wrapped.
# ruff: noqa: E501
"""Regenerate the fork-style patch series and its hand-made rebase expectations.

series/                 the fork's patches, on llama.cpp 4227c9be (llama-cpp-python 0.3.16)
expected/0.3.17/        the same edits made by hand on 49bfddec (llama-cpp-python 0.3.17)
expected/0.3.19/        the same edits made by hand on c0159f9c (llama-cpp-python 0.3.19)

Each patch below is declarative: a list of edits, each an exact old text (which must occur exactly
once in the file at that point of the series) and its replacement. For each target version a patch
either reuses its 0.3.16 edits (SAME: the old text is still there, unchanged), gives its own edits
(made by hand where the code now lives), or is not carried (None: conflict or already upstream;
see expected.toml for why). Every carried patch is committed in a throw-away git repository of the
tree, on top of the earlier carried patches, and written out with git format-patch, so that the
expected files share From/Date/Subject/body with the series and differ only in the diff.

Usage:  make_series.py            write series/ and expected/
        make_series.py --check    regenerate into a temporary directory and compare byte for byte
        make_series.py --keep DIR also keep the throw-away repositories (DIR must not exist)
The trees come from $PORTKIT_CACHE/trees (default ~/.cache/portkit/trees), as fetched by portkit.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("PORTKIT_CACHE", Path.home() / ".cache" / "portkit"))
BASE = "0.3.16"
TARGETS = ("0.3.17", "0.3.19")
COMMITS = {"0.3.16": "4227c9be", "0.3.17": "49bfddec", "0.3.19": "c0159f9c"}
FORMAT_PATCH = ["format-patch", "--no-signature", "--no-numbered", "--zero-commit"]


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str
    after: str = ""  # if set: a unique anchor; old is the first occurrence after it


def E(path: str, old: str, new: str, after: str = "") -> Edit:
    """An edit; the texts are written as raw blocks that start with a newline, dropped here."""
    return Edit(path, old.removeprefix("\n"), new.removeprefix("\n"), after)


def moved(edit: Edit, path: str, after: str = "") -> Edit:
    """The same edit, made in the file (and after the anchor) where the code lives now."""
    return Edit(path, edit.old, edit.new, after)


SAME = "same"  # the 0.3.16 edits make the change on the target too


@dataclass(frozen=True)
class Patch:
    author: str
    date: str
    subject: str
    body: str
    edits: tuple[Edit, ...]
    targets: dict[str, object]  # version -> SAME | tuple[Edit, ...] | None (not carried)


MARA = "Mara Lindqvist <mara.lindqvist@forge.example.org>"
TOMASZ = "Tomasz Wrona <tomasz.wrona@forge.example.org>"
INES = "Ines Okafor <ines.okafor@forge.example.org>"
DEV = "Dev Raghunathan <dev.r@forge.example.org>"
LUCIA = "Lucía Ferrer <lucia.ferrer@forge.example.org>"

GGML_ALLOC = "ggml/src/ggml-alloc.c"
GGML_C = "ggml/src/ggml.c"
GGUF_CPP = "ggml/src/gguf.cpp"
LLAMA_H = "include/llama.h"
MODEL_CPP = "src/llama-model.cpp"
CONTEXT_CPP = "src/llama-context.cpp"
VOCAB_CPP = "src/llama-vocab.cpp"
BATCH_CPP = "src/llama-batch.cpp"
GRAPH_CPP = "src/llama-graph.cpp"

PATCHES: list[Patch] = []


def patch(
    author: str, date: str, subject: str, body: str, edits: list[Edit], **targets: object
) -> None:
    """Declare the next patch of the series; targets are given as v0_3_17=..., v0_3_19=..."""
    versions = {k.removeprefix("v").replace("_", "."): v for k, v in targets.items()}
    assert set(versions) == set(TARGETS), versions
    PATCHES.append(Patch(author, date, subject, body.strip() + "\n", tuple(edits), versions))


# --------------------------------------------------------------------------------------------
# The series
# --------------------------------------------------------------------------------------------

patch(MARA, "2025-08-18T09:12:44+02:00",
      "ggml: do not abort when the terminate handler cannot be registered",
      """
Some hosts (the Go runtime with cgo on Windows, sandboxed plugin loaders)
throw from std::get_terminate()/std::set_terminate() during static
initialisation. ggml then aborts before main() runs. Treat a failure to
install the backtrace handler as "no backtrace" instead.
""",
      [E("ggml/src/ggml.cpp", r"""
    const auto prev{std::get_terminate()};
    GGML_ASSERT(prev != ggml_uncaught_exception);
    previous_terminate_handler = prev;
    std::set_terminate(ggml_uncaught_exception);
    return true;
}();
""", r"""
    try {
        const auto prev{std::get_terminate()};
        GGML_ASSERT(prev != ggml_uncaught_exception);
        previous_terminate_handler = prev;
        std::set_terminate(ggml_uncaught_exception);
        return true;
    } catch (...) {
        return false;
    }
}();
""")],
      v0_3_17=SAME, v0_3_19=SAME)

patch(TOMASZ, "2025-08-19T16:40:02+02:00",
      "ggml-cpu: skip thread power throttling with GNU C on win32",
      """
MinGW's headers declare SetThreadInformation() but not the
THREAD_POWER_THROTTLING_* constants and struct, so the MinGW build of the
CPU backend fails. Only disable power throttling with MSVC/clang-cl.
""",
      [E("ggml/src/ggml-cpu/ggml-cpu.c", r"""
        // n_threads > 4
        #if _WIN32_WINNT >= 0x0602
""", r"""
        // n_threads > 4
        // MinGW declares SetThreadInformation() but not THREAD_POWER_THROTTLING_STATE and its
        // constants: only MSVC and clang-cl builds can turn power throttling off here
        #if _WIN32_WINNT >= 0x0602 && !defined(__GNUC__)
"""),
       E("ggml/src/ggml-cpu/ggml-cpu.c", r"""
            return false;
        }
        #endif
""", r"""
            return false;
        }
        #endif // _WIN32_WINNT >= 0x0602 && !defined(__GNUC__)
""")],
      v0_3_17=SAME, v0_3_19=SAME)

patch(MARA, "2025-08-20T11:03:17+02:00",
      "ggml-alloc: warn when a multi-buffer graph needs an explicit reserve",
      """
ggml_gallocr_alloc_graph() silently returns false for multi-buffer graphs
that changed shape, and the message explaining why is only printed in
debug builds. Release builds then fail much later with an unrelated error.
Always print it, as a warning.
""",
      [E(GGML_ALLOC, r"""
        if (galloc->n_buffers == 1) {
#ifndef NDEBUG
            GGML_LOG_DEBUG("%s: reallocating buffers automatically\n", __func__);
#endif
            if (!ggml_gallocr_reserve(galloc, graph)) {
                return false;
            }
        } else {
#ifndef NDEBUG
            GGML_LOG_DEBUG("%s: cannot reallocate multi buffer graph automatically, call reserve\n", __func__);
#endif
            return false;
""", r"""
        if (galloc->n_buffers == 1) {
            GGML_LOG_DEBUG("%s: reallocating buffers automatically\n", __func__);
            if (!ggml_gallocr_reserve(galloc, graph)) {
                return false;
            }
        } else {
            GGML_LOG_WARN("%s: cannot reallocate multi buffer graph automatically, call reserve\n", __func__);
            return false;
""")],
      v0_3_17=SAME, v0_3_19=SAME)

patch(INES, "2025-08-21T14:27:51+01:00",
      "ggml: require an F16 mask in ggml_flash_attn_ext",
      """
All flash attention kernels read the mask as F16. An F32 mask is accepted
by the CPU backend but read as garbage by the CUDA and Metal ones, which
took us a day to track down. Fail early in the graph builder instead.
""",
      [E(GGML_C, r"""
    if (mask) {
        GGML_ASSERT(ggml_is_contiguous(mask));
        GGML_ASSERT(mask->ne[1] >= GGML_PAD(q->ne[1], GGML_KQ_MASK_PAD) &&
""", r"""
    if (mask) {
        // every flash attention kernel reads the mask as F16: an F32 mask is accepted by the
        // CPU backend but silently misread by the CUDA and Metal kernels, so refuse it here
        // rather than produce garbage (the graph casts the mask, see self_kq_mask_cnv)
        GGML_ASSERT(mask->type == GGML_TYPE_F16);

        GGML_ASSERT(ggml_is_contiguous(mask));
        GGML_ASSERT(mask->ne[1] >= GGML_PAD(q->ne[1], GGML_KQ_MASK_PAD) &&
""")],
      v0_3_17=(
          E(GGML_C, r"""
    if (mask) {
        GGML_ASSERT(ggml_is_contiguous(mask));
        //GGML_ASSERT(ggml_can_repeat_rows(mask, qk));
""", r"""
    if (mask) {
        // every flash attention kernel reads the mask as F16: an F32 mask is accepted by the
        // CPU backend but silently misread by the CUDA and Metal kernels, so refuse it here
        // rather than produce garbage (the graph casts the mask, see self_kq_mask_cnv)
        GGML_ASSERT(mask->type == GGML_TYPE_F16);

        GGML_ASSERT(ggml_is_contiguous(mask));
        //GGML_ASSERT(ggml_can_repeat_rows(mask, qk));
"""),),
      v0_3_19=None)

patch(DEV, "2025-08-22T08:55:30-07:00",
      "ggml-backend: assert the destination buffer in ggml_backend_buffer_copy_tensor",
      """
Copying into a tensor that has no buffer yet dereferenced a NULL buffer
and crashed without a message. Assert with a readable reason instead.
""",
      [E("ggml/src/ggml-backend.cpp", r"""
    ggml_backend_buffer_t dst_buf = dst->view_src ? dst->view_src->buffer : dst->buffer;
    if (dst_buf->iface.cpy_tensor) {
""", r"""
    ggml_backend_buffer_t dst_buf = dst->view_src ? dst->view_src->buffer : dst->buffer;
    // these used to crash with a NULL dereference or copy past the end: say why instead
    GGML_ASSERT(dst_buf != NULL && "destination tensor buffer not set");
    GGML_ASSERT(src->data != NULL && "source tensor not allocated");
    GGML_ASSERT(ggml_nbytes(src) == ggml_nbytes(dst) && "source and destination sizes differ");

    if (dst_buf->iface.cpy_tensor) {
""")],
      v0_3_17=SAME, v0_3_19=SAME)

patch(DEV, "2025-08-22T10:31:12-07:00",
      "gguf: add gguf_init_from_file_ptr() to read GGUF from an open FILE",
      """
The runner receives model files as already-open descriptors from the
sandbox broker and cannot reopen them by path. Expose the FILE-based
reader that gguf_init_from_file() already uses internally.
""",
      [E("ggml/include/gguf.h", r"""
    GGML_API struct gguf_context * gguf_init_from_file(const char * fname, struct gguf_init_params params);
""", r"""
    GGML_API struct gguf_context * gguf_init_from_file(const char * fname, struct gguf_init_params params);
    GGML_API struct gguf_context * gguf_init_from_file_ptr(FILE * file, struct gguf_init_params params);
"""),
       E(GGUF_CPP, r"""
    struct gguf_context * result = gguf_init_from_file_impl(file, params);
    fclose(file);
    return result;
}
""", r"""
    struct gguf_context * result = gguf_init_from_file_impl(file, params);
    fclose(file);
    return result;
}

struct gguf_context * gguf_init_from_file_ptr(FILE * file, struct gguf_init_params params) {
    if (!file) {
        return nullptr;
    }
    return gguf_init_from_file_impl(file, params);
}
""")],
      v0_3_17=SAME, v0_3_19=None)

patch(DEV, "2025-08-25T09:14:45-07:00",
      "gguf: optional trace of the FILE position when reading a GGUF header",
      """
With gguf_init_from_file_ptr() the caller owns the FILE and its position.
When GGML_GGUF_DEBUG is set, log where reading starts, to diagnose
callers that hand us a FILE that is not at the start of the GGUF data.
""",
      [E(GGUF_CPP, r"""
struct gguf_context * gguf_init_from_file_impl(FILE * file, struct gguf_init_params params) {
    const struct gguf_reader gr(file);
""", r"""
struct gguf_context * gguf_init_from_file_impl(FILE * file, struct gguf_init_params params) {
    if (getenv("GGML_GGUF_DEBUG") != nullptr) {
        // callers of gguf_init_from_file_ptr() own the FILE: it need not be at offset 0
        GGML_LOG_DEBUG("%s: reading GGUF from FILE %p at offset %ld\n", __func__, (void *) file, ftell(file));
    }

    const struct gguf_reader gr(file);
""")],
      v0_3_17=SAME, v0_3_19=(
          E(GGUF_CPP, r"""
struct gguf_context * gguf_init_from_file_ptr(FILE * file, struct gguf_init_params params) {
    if (!file) {
        return nullptr;
    }

    const struct gguf_reader gr(file);
""", r"""
struct gguf_context * gguf_init_from_file_ptr(FILE * file, struct gguf_init_params params) {
    if (!file) {
        return nullptr;
    }

    if (getenv("GGML_GGUF_DEBUG") != nullptr) {
        // callers of gguf_init_from_file_ptr() own the FILE: it need not be at offset 0
        GGML_LOG_DEBUG("%s: reading GGUF from FILE %p at offset %ld\n", __func__, (void *) file, ftell(file));
    }

    const struct gguf_reader gr(file);
"""),))

patch(MARA, "2025-08-26T13:48:09+02:00",
      "llama: add llama_log_get() to read back the current log callback",
      """
Bindings that temporarily redirect the log (to capture load errors) need
to restore the previous callback afterwards. Add getters next to the
setters in ggml and llama.
""",
      [E("ggml/include/ggml.h", r"""
    GGML_API void ggml_log_set(ggml_log_callback log_callback, void * user_data);
""", r"""
    GGML_API void ggml_log_set(ggml_log_callback log_callback, void * user_data);

    // Get the current logging callback and its user data.
    GGML_API void ggml_log_get(ggml_log_callback * log_callback, void ** user_data);
"""),
       E(GGML_C, r"""
void ggml_log_set(ggml_log_callback log_callback, void * user_data) {
    g_logger_state.log_callback = log_callback ? log_callback : ggml_log_callback_default;
    g_logger_state.log_callback_user_data = user_data;
}
""", r"""
void ggml_log_set(ggml_log_callback log_callback, void * user_data) {
    g_logger_state.log_callback = log_callback ? log_callback : ggml_log_callback_default;
    g_logger_state.log_callback_user_data = user_data;
}

void ggml_log_get(ggml_log_callback * log_callback, void ** user_data) {
    *log_callback = g_logger_state.log_callback;
    *user_data    = g_logger_state.log_callback_user_data;
}
"""),
       E(LLAMA_H, r"""
    LLAMA_API void llama_log_set(ggml_log_callback log_callback, void * user_data);
""", r"""
    LLAMA_API void llama_log_set(ggml_log_callback log_callback, void * user_data);

    // Get the current logging callback and its user data.
    LLAMA_API void llama_log_get(ggml_log_callback * log_callback, void ** user_data);
"""),
       E("src/llama-impl.cpp", r"""
    g_logger_state.log_callback_user_data = user_data;
}
""", r"""
    g_logger_state.log_callback_user_data = user_data;
}

void llama_log_get(ggml_log_callback * log_callback, void ** user_data) {
    ggml_log_get(log_callback, user_data);
}
""")],
      v0_3_17=None, v0_3_19=None)

patch(MARA, "2025-08-26T15:02:33+02:00",
      "llama: add llama_model_is_hybrid()",
      """
The server decides between full and partial state snapshots per model
kind. It can ask llama_model_is_recurrent() but has no way to tell a
hybrid (attention + recurrent) model from a transformer. Expose the
existing llm_arch_is_hybrid() the same way.
""",
      [E(LLAMA_H, r"""
    LLAMA_API bool llama_model_is_recurrent(const struct llama_model * model);

""", r"""
    LLAMA_API bool llama_model_is_recurrent(const struct llama_model * model);

    // Returns true if the model is hybrid (like Jamba, Granite, etc.)
    LLAMA_API bool llama_model_is_hybrid(const struct llama_model * model);

"""),
       E(MODEL_CPP, r"""
bool llama_model_is_recurrent(const llama_model * model) {
    return llm_arch_is_recurrent(model->arch);
}
""", r"""
bool llama_model_is_recurrent(const llama_model * model) {
    return llm_arch_is_recurrent(model->arch);
}

bool llama_model_is_hybrid(const llama_model * model) {
    return llm_arch_is_hybrid(model->arch);
}
""")],
      v0_3_17=None, v0_3_19=None)

patch(INES, "2025-08-27T10:19:40+01:00",
      "llama: add accessors for the head sizes and rotary dimensions",
      """
The KV cache sizing in our scheduler needs the per-head key/value sizes
and the number of rotary dimensions; bindings currently read them from
the GGUF metadata themselves, which breaks for models whose loader
derives them (MLA, partial rotary).
""",
      [E(LLAMA_H, r"""
    LLAMA_API int32_t llama_model_n_swa      (const struct llama_model * model);
""", r"""
    LLAMA_API int32_t llama_model_n_swa      (const struct llama_model * model);
    LLAMA_API int32_t llama_model_n_embd_head_k(const struct llama_model * model);
    LLAMA_API int32_t llama_model_n_embd_head_v(const struct llama_model * model);
    LLAMA_API int32_t llama_model_n_rot        (const struct llama_model * model);
"""),
       E(MODEL_CPP, r"""
int32_t llama_model_n_swa(const llama_model * model) {
    return model->hparams.n_swa;
}
""", r"""
int32_t llama_model_n_swa(const llama_model * model) {
    return model->hparams.n_swa;
}

int32_t llama_model_n_embd_head_k(const llama_model * model) {
    return model->hparams.n_embd_head_k;
}

int32_t llama_model_n_embd_head_v(const llama_model * model) {
    return model->hparams.n_embd_head_v;
}

int32_t llama_model_n_rot(const llama_model * model) {
    return model->hparams.n_rot;
}
""")],
      v0_3_17=SAME, v0_3_19=SAME)

patch(TOMASZ, "2025-08-28T17:36:58+02:00",
      "llama: add llama_model_peek_arch() to read the architecture only",
      """
The model picker shows the architecture of every file in the models
directory. Loading each model (even vocab-only) is too slow for that;
read the GGUF header through the model loader and return the name.
""",
      [E(LLAMA_H, r"""
    LLAMA_API void llama_model_save_to_file(
            const struct llama_model * model,
                        const char * path_model);
""", r"""
    LLAMA_API void llama_model_save_to_file(
            const struct llama_model * model,
                        const char * path_model);

    // Write the architecture name of the model at path_model into buf without loading it.
    // Returns the length of the name, or -1 on error.
    LLAMA_API int32_t llama_model_peek_arch(const char * path_model, char * buf, size_t buf_size);
"""),
       E("src/llama.cpp", r"""
    ms.save(path_model);
}
""", r"""
    ms.save(path_model);
}

int32_t llama_model_peek_arch(const char * path_model, char * buf, size_t buf_size) {
    try {
        std::vector<std::string> splits = {};
        llama_model_loader ml(path_model, splits, /*use_mmap*/ false, /*check_tensors*/ false,
                /*param_overrides_p*/ nullptr, /*param_tensor_buft_overrides_p*/ nullptr);
        return snprintf(buf, buf_size, "%s", ml.get_arch_name().c_str());
    } catch (const std::exception & err) {
        LLAMA_LOG_ERROR("%s: failed to read '%s': %s\n", __func__, path_model, err.what());
        return -1;
    }
}
""")],
      v0_3_17=SAME, v0_3_19=SAME)


patch(LUCIA, "2025-08-29T12:05:41+02:00",
      "llama: expose llama_n_ctx_per_seq()",
      """
With kv_unified=false every sequence gets n_ctx/n_seq_max cells. Clients
need that number to truncate prompts per slot, and computing it on their
side goes wrong when the context rounds n_ctx. Return what the context
actually uses.
""",
      [E(LLAMA_H, r"""
    LLAMA_API uint32_t llama_n_ctx      (const struct llama_context * ctx);
""", r"""
    LLAMA_API uint32_t llama_n_ctx      (const struct llama_context * ctx);
    LLAMA_API uint32_t llama_n_ctx_per_seq(const struct llama_context * ctx);
"""),
       E(CONTEXT_CPP, r"""
uint32_t llama_n_ctx(const llama_context * ctx) {
    return ctx->n_ctx();
}
""", r"""
uint32_t llama_n_ctx(const llama_context * ctx) {
    return ctx->n_ctx();
}

uint32_t llama_n_ctx_per_seq(const llama_context * ctx) {
    return ctx->n_ctx_per_seq();
}
""")],
      v0_3_17=None, v0_3_19=None)

patch(LUCIA, "2025-09-01T09:40:26+02:00",
      "context: log the KV defragmentation threshold",
      """
Support requests about slow long generations keep coming down to
defragmentation being off. Print the threshold with the other context
parameters so that it shows up in user logs.
""",
      [E(CONTEXT_CPP, r"""
    LLAMA_LOG_INFO("%s: freq_scale    = %g\n",   __func__, cparams.rope_freq_scale);
""", r"""
    LLAMA_LOG_INFO("%s: freq_scale    = %g\n",   __func__, cparams.rope_freq_scale);
    LLAMA_LOG_INFO("%s: defrag_thold  = %.2f\n", __func__, cparams.defrag_thold);

    if (cparams.defrag_thold <= 0.0f && cparams.n_ctx > 32768) {
        LLAMA_LOG_WARN("%s: KV cache defragmentation is disabled: long generations may slow down\n", __func__);
    }
""")],
      v0_3_17=SAME, v0_3_19=SAME)

patch(LUCIA, "2025-09-01T15:22:09+02:00",
      "llama: warn once when the deprecated llama_kv_self_* API is used",
      """
Our Python and Go bindings still call llama_kv_self_clear() and
llama_kv_self_seq_rm(). Warn once so that we notice before upstream
removes them.
""",
      [E(CONTEXT_CPP, r"""
//
// kv cache
//

// deprecated
int32_t llama_kv_self_n_tokens(const llama_context * ctx) {
""", r"""
//
// kv cache
//

static void llama_kv_self_warn_deprecated(const char * func) {
    static bool warned = false;
    if (!warned) {
        LLAMA_LOG_WARN("%s: the llama_kv_self_* API is deprecated, use llama_memory_* instead\n", func);
        warned = true;
    }
}

// deprecated
int32_t llama_kv_self_n_tokens(const llama_context * ctx) {
"""),
       E(CONTEXT_CPP, r"""
void llama_kv_self_clear(llama_context * ctx) {
    auto * kv = llama_get_memory(ctx);
""", r"""
void llama_kv_self_clear(llama_context * ctx) {
    llama_kv_self_warn_deprecated(__func__);

    auto * kv = llama_get_memory(ctx);
"""),
       E(CONTEXT_CPP, r"""
            llama_pos   p1) {
    auto * kv = llama_get_memory(ctx);
    if (!kv) {
        return true;
    }

    return llama_memory_seq_rm(kv, seq_id, p0, p1);
""", r"""
            llama_pos   p1) {
    llama_kv_self_warn_deprecated(__func__);

    auto * kv = llama_get_memory(ctx);
    if (!kv) {
        return true;
    }

    return llama_memory_seq_rm(kv, seq_id, p0, p1);
""")],
      v0_3_17=None, v0_3_19=None)

patch(TOMASZ, "2025-09-02T10:11:52+02:00",
      "vocab: fall back to the default pre-tokenizer for unknown types",
      """
Community GGUF conversions often carry a tokenizer.ggml.pre value that
this llama.cpp does not know yet. Refusing to load them is worse for our
users than tokenizing with the default regex; warn and carry on.
""",
      [E(VOCAB_CPP, r"""
            } else {
                throw std::runtime_error(format("unknown pre-tokenizer type: '%s'", tokenizer_pre.c_str()));
            }
""", r"""
            } else {
                // community conversions often carry pre-tokenizer names this version does not know;
                // tokenizing with the default regex serves users better than refusing the model
                LLAMA_LOG_WARN("%s: missing or unrecognized pre-tokenizer type '%s', using: 'default'\n", __func__, tokenizer_pre.c_str());
                pre_type = LLAMA_VOCAB_PRE_TYPE_DEFAULT;
            }
""")],
      v0_3_17=SAME, v0_3_19=SAME)

patch(TOMASZ, "2025-09-03T14:58:13+02:00",
      "vocab: add the grok-2 pre-tokenizer",
      """
Grok-2 GGUFs declare tokenizer.ggml.pre = "grok-2". Its split regex is the
GPT-4o one without the digit grouping; add it as its own type.
""",
      [E("src/llama-vocab.h", r"""
    LLAMA_VOCAB_PRE_TYPE_HUNYUAN_DENSE  = 38,
""", r"""
    LLAMA_VOCAB_PRE_TYPE_HUNYUAN_DENSE  = 38,
    LLAMA_VOCAB_PRE_TYPE_GROK_2         = 39,
"""),
       E(VOCAB_CPP, r"""
                    "\\p{Han}+",
                };
                break;
""", r"""
                    "\\p{Han}+",
                };
                break;
            case LLAMA_VOCAB_PRE_TYPE_GROK_2:
                regex_exprs = {
                    // original regex from tokenizer.json
                    // "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
                    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                };
                break;
"""),
       E(VOCAB_CPP, r"""
                tokenizer_pre == "kimi-k2") {
                pre_type = LLAMA_VOCAB_PRE_TYPE_KIMI_K2;
                clean_spaces = false;
""", r"""
                tokenizer_pre == "kimi-k2") {
                pre_type = LLAMA_VOCAB_PRE_TYPE_KIMI_K2;
                clean_spaces = false;
            } else if (
                tokenizer_pre == "grok-2") {
                pre_type = LLAMA_VOCAB_PRE_TYPE_GROK_2;
                clean_spaces = false;
""")],
      v0_3_17=None, v0_3_19=None)

patch(DEV, "2025-09-04T11:30:00-07:00",
      "batch: reject tokens with an invalid number of sequence ids",
      """
A client sending n_seq_id[i] = 0 (or garbage) made llama_decode() read
past the seq_id arrays. Validate the count with the other input checks.
""",
      [E(BATCH_CPP, r"""
    if (batch.seq_id) {
        for (int32_t i = 0; i < batch.n_tokens; ++i) {
            for (int32_t s = 0; s < batch.n_seq_id[i]; ++s) {
""", r"""
    if (batch.seq_id) {
        for (int32_t i = 0; i < batch.n_tokens; ++i) {
            // n_seq_id[i] bounds the seq_id[i] reads below: check it first
            if (batch.n_seq_id[i] <= 0 || batch.n_seq_id[i] > LLAMA_MAX_SEQ) {
                LLAMA_LOG_ERROR("%s: invalid n_seq_id[%d] = %d\n", __func__, i, batch.n_seq_id[i]);
                return false;
            }
            for (int32_t s = 0; s < batch.n_seq_id[i]; ++s) {
""")],
      v0_3_17=SAME, v0_3_19=SAME)

patch(INES, "2025-09-05T16:07:44+01:00",
      "batch: reserve n_pos_per_embd positions per token in ubatch_reserve",
      """
Reserving a graph for an M-RoPE model (Qwen2-VL) sized the position
buffer for one position per token, but the graph reads n_pos_per_embd of
them: the worst-case reservation read past the buffer. Size it for all
position components, and print n_pos_per_embd in the batch debug output.
""",
      [E(BATCH_CPP, r"""
        LLAMA_LOG_DEBUG("%s: input batch info:\n", __func__);
""", r"""
        LLAMA_LOG_DEBUG("%s: input batch info (n_pos_per_embd = %u):\n", __func__, n_pos_per_embd);
"""),
       E(BATCH_CPP, r"""
    clear();
    split_reset();

    auto udata = std::make_shared<llama_ubatch::data_t>();

    udata->token     .resize(n_tokens);
    udata->embd      .clear();
    udata->pos       .resize(n_tokens);
""", r"""
    clear();
    split_reset();

    const int64_t n_pos_all = (int64_t) n_tokens*n_pos_per_embd;

    auto udata = std::make_shared<llama_ubatch::data_t>();

    udata->token     .resize(n_tokens);
    udata->embd      .clear();
    udata->pos       .resize(n_pos_all);
""")],
      v0_3_17=(E(BATCH_CPP, r"""
        LLAMA_LOG_DEBUG("%s: input batch info:\n", __func__);
""", r"""
        LLAMA_LOG_DEBUG("%s: input batch info (n_pos_per_embd = %u):\n", __func__, n_pos_per_embd);
"""),),
      v0_3_19=(E(BATCH_CPP, r"""
        LLAMA_LOG_DEBUG("%s: input batch info:\n", __func__);
""", r"""
        LLAMA_LOG_DEBUG("%s: input batch info (n_pos_per_embd = %u):\n", __func__, n_pos_per_embd);
"""),))

SEQ_RM = E("src/llama-kv-cache-unified.cpp", r"""
    if (p1 < 0) {
        p1 = std::numeric_limits<llama_pos>::max();
    }

    if (seq_id >= 0) {
        auto & cells = v_cells[seq_to_stream[seq_id]];
        auto & head  = v_heads[seq_to_stream[seq_id]];
""", r"""
    if (p1 < 0) {
        p1 = std::numeric_limits<llama_pos>::max();
    }

    if (p0 >= p1) {
        // empty range: nothing to remove
        return true;
    }

    if (seq_id >= 0) {
        auto & cells = v_cells[seq_to_stream[seq_id]];
        auto & head  = v_heads[seq_to_stream[seq_id]];
""")

patch(MARA, "2025-09-08T10:44:18+02:00",
      "kv-cache: treat an empty range in seq_rm as a no-op",
      """
The server calls llama_memory_seq_rm(mem, id, n_past, n_past) after a
full cache hit. With p0 == p1 nothing should be removed, but the loop
still walks every cell of every stream. Return early.
""",
      [SEQ_RM],
      v0_3_17=(moved(SEQ_RM, "src/llama-kv-cache.cpp"),),
      v0_3_19=(moved(SEQ_RM, "src/llama-kv-cache.cpp"),))

patch(MARA, "2025-09-08T17:20:51+02:00",
      "kv-cache: do not defragment when the graph is too small for one move",
      """
defrag_prepare() computes the move budget as (n_max_nodes - 2*n_layer)
in unsigned arithmetic. For tiny graphs (embedding models with a small
n_ctx) that wraps around and the defrag graph overflows its node budget.
Skip defragmentation in that case.
""",
      [E("src/llama-kv-cache-unified.cpp", r"""
    const uint32_t max_moves = (n_max_nodes - 2*n_layer)/(6*n_layer);
""", r"""
    if (n_max_nodes <= (int32_t) (2*n_layer)) {
        LLAMA_LOG_WARN("%s: graph too small to defragment the KV cache (n_max_nodes = %d)\n", __func__, n_max_nodes);
        return {};
    }

    const uint32_t max_moves = (n_max_nodes - 2*n_layer)/(6*n_layer);
""")],
      v0_3_17=None, v0_3_19=None)

EQUAL_SPLIT = E("src/llama-kv-cache-unified-iswa.cpp", r"""
    } while (false);

    // if it fails, try equal split
    do {
""", r"""
    } while (false);

    // if it fails, try equal split
    // (multi-sequence batches with an SWA cache often end up here, and equal splits are much
    // slower: make the fallback visible when debugging throughput)
    LLAMA_LOG_DEBUG("%s: simple split of %u tokens failed, trying equal split (n_ubatch = %u)\n",
            __func__, balloc.get_n_tokens(), n_ubatch);

    do {
""")

patch(DEV, "2025-09-09T13:02:37-07:00",
      "kv-cache-iswa: log when the simple split fails",
      """
Gemma 3 batches with several sequences are much slower than with one.
The reason is the fallback to equal splits in the SWA cache; make it
visible in debug logs.
""",
      [EQUAL_SPLIT],
      v0_3_17=(moved(EQUAL_SPLIT, "src/llama-kv-cache-iswa.cpp"),),
      v0_3_19=(moved(EQUAL_SPLIT, "src/llama-kv-cache-iswa.cpp"),))

patch(INES, "2025-09-10T09:51:05+01:00",
      "graph: name the weighted MoE expert output, not the layer input",
      """
The callback after weighting the expert outputs was given `cur` (the
input of the layer) instead of `experts`, so the eval callback and graph
dumps showed the wrong tensor as ffn_moe_weighted.
""",
      [E(GRAPH_CPP, r"""
        experts = ggml_mul(ctx0, experts, weights);
        cb(cur, "ffn_moe_weighted", il);
""", r"""
        experts = ggml_mul(ctx0, experts, weights);
        // `cur` is still the input of the layer here: name the weighted expert outputs, or the
        // eval callback and graph dumps show the layer input as ffn_moe_weighted (found while
        // comparing activations with the reference implementation)
        cb(experts, "ffn_moe_weighted", il);
""")],
      v0_3_17=SAME, v0_3_19=None)

ASSERT_MCTX = r"""    // a graph reused after the memory module was replaced has no memory context: fail here
    // with a message instead of a NULL dereference deep inside the KV cache
    GGML_ASSERT(mctx != nullptr && "set_input() called before the memory context was set");

"""


def set_input_edits(kv: str, iswa: str) -> tuple[Edit, ...]:
    """Assert at the entry of both KV inputs' set_input(), for the given class names."""
    return (
        E(GRAPH_CPP, f"""
void {kv}::set_input(const llama_ubatch * ubatch) {{
    mctx->set_input_k_idxs(self_k_idxs, ubatch);
""", f"""
void {kv}::set_input(const llama_ubatch * ubatch) {{
{ASSERT_MCTX}    mctx->set_input_k_idxs(self_k_idxs, ubatch);
"""),
        E(GRAPH_CPP, f"""
void {iswa}::set_input(const llama_ubatch * ubatch) {{
    mctx->get_base()->set_input_k_idxs(self_k_idxs, ubatch);
""", f"""
void {iswa}::set_input(const llama_ubatch * ubatch) {{
    GGML_ASSERT(mctx != nullptr && "set_input() called before the memory context was set");

    mctx->get_base()->set_input_k_idxs(self_k_idxs, ubatch);
"""),
    )


patch(INES, "2025-09-10T15:33:29+01:00",
      "graph: assert that the KV inputs have a memory context",
      """
A graph reused after the memory module was replaced crashed with a NULL
dereference deep inside the KV cache. Assert with a message at the
entry of set_input() of both KV inputs instead.
""",
      list(set_input_edits("llm_graph_input_attn_kv_unified", "llm_graph_input_attn_kv_unified_iswa")),
      v0_3_17=set_input_edits("llm_graph_input_attn_kv", "llm_graph_input_attn_kv_iswa"),
      v0_3_19=set_input_edits("llm_graph_input_attn_kv", "llm_graph_input_attn_kv_iswa"))

patch(INES, "2025-09-11T11:17:40+01:00",
      "graph: name the KQ mask input of the unified KV cache",
      """
In scheduler debug output and graph dumps the KQ mask shows up as an
unnamed leaf, which makes the split reports hard to read. Name it (and
its F16 copy) after the number of streams it covers.
""",
      [E(GRAPH_CPP, r"""
        inp->self_kq_mask = ggml_new_tensor_4d(ctx0, GGML_TYPE_F32, n_kv, GGML_PAD(n_tokens/n_stream, GGML_KQ_MASK_PAD), 1, n_stream);
        ggml_set_input(inp->self_kq_mask);

        inp->self_kq_mask_cnv = cparams.flash_attn ? ggml_cast(ctx0, inp->self_kq_mask, GGML_TYPE_F16) : inp->self_kq_mask;
""", r"""
        inp->self_kq_mask = ggml_new_tensor_4d(ctx0, GGML_TYPE_F32, n_kv, GGML_PAD(n_tokens/n_stream, GGML_KQ_MASK_PAD), 1, n_stream);
        ggml_format_name(inp->self_kq_mask, "kq_mask_s%d", (int) n_stream);
        ggml_set_input(inp->self_kq_mask);

        inp->self_kq_mask_cnv = cparams.flash_attn ? ggml_cast(ctx0, inp->self_kq_mask, GGML_TYPE_F16) : inp->self_kq_mask;
        if (inp->self_kq_mask_cnv != inp->self_kq_mask) {
            // the F16 copy read by the flash attention kernels
            ggml_format_name(inp->self_kq_mask_cnv, "kq_mask_s%d_f16", (int) n_stream);
        }
""", after="static std::unique_ptr<llm_graph_input_attn_kv_unified> build_attn_inp_kv_unified_impl(")],
      v0_3_17=None, v0_3_19=None)

QWEN2_LOAD = "            case LLM_ARCH_QWEN2:\n            case LLM_ARCH_QWEN2VL:\n"
QWEN2_GRAPH = "struct llm_build_qwen2 : public llm_graph_context {"

patch(TOMASZ, "2025-09-12T10:26:33+02:00",
      "model: make the qwen2 attention biases optional",
      """
Several Qwen2-architecture finetunes (and the Qwen2-based embedding
models we ship) were exported without q/k/v biases. Load them as optional
and skip the add when they are missing.
""",
      [E(MODEL_CPP, r"""
                        layer.bq = create_tensor(tn(LLM_TENSOR_ATTN_Q,   "bias", i), {n_embd}, 0);
                        layer.bk = create_tensor(tn(LLM_TENSOR_ATTN_K,   "bias", i), {n_embd_gqa}, 0);
                        layer.bv = create_tensor(tn(LLM_TENSOR_ATTN_V,   "bias", i), {n_embd_gqa}, 0);
""", r"""
                        layer.bq = create_tensor(tn(LLM_TENSOR_ATTN_Q,   "bias", i), {n_embd}, TENSOR_NOT_REQUIRED);
                        layer.bk = create_tensor(tn(LLM_TENSOR_ATTN_K,   "bias", i), {n_embd_gqa}, TENSOR_NOT_REQUIRED);
                        layer.bv = create_tensor(tn(LLM_TENSOR_ATTN_V,   "bias", i), {n_embd_gqa}, TENSOR_NOT_REQUIRED);
""", after=QWEN2_LOAD),
       E(MODEL_CPP, r"""
                ggml_tensor * Qcur = build_lora_mm(model.layers[il].wq, cur);
                Qcur = ggml_add(ctx0, Qcur, model.layers[il].bq);
                cb(Qcur, "Qcur", il);

                ggml_tensor * Kcur = build_lora_mm(model.layers[il].wk, cur);
                Kcur = ggml_add(ctx0, Kcur, model.layers[il].bk);
                cb(Kcur, "Kcur", il);

                ggml_tensor * Vcur = build_lora_mm(model.layers[il].wv, cur);
                Vcur = ggml_add(ctx0, Vcur, model.layers[il].bv);
                cb(Vcur, "Vcur", il);
""", r"""
                ggml_tensor * Qcur = build_lora_mm(model.layers[il].wq, cur);
                if (model.layers[il].bq) {
                    Qcur = ggml_add(ctx0, Qcur, model.layers[il].bq);
                }
                cb(Qcur, "Qcur", il);

                ggml_tensor * Kcur = build_lora_mm(model.layers[il].wk, cur);
                if (model.layers[il].bk) {
                    Kcur = ggml_add(ctx0, Kcur, model.layers[il].bk);
                }
                cb(Kcur, "Kcur", il);

                ggml_tensor * Vcur = build_lora_mm(model.layers[il].wv, cur);
                if (model.layers[il].bv) {
                    Vcur = ggml_add(ctx0, Vcur, model.layers[il].bv);
                }
                cb(Vcur, "Vcur", il);
""", after=QWEN2_GRAPH)],
      v0_3_17=None, v0_3_19=None)

patch(TOMASZ, "2025-09-12T16:49:02+02:00",
      "model: name the qwen2 attention output",
      """
Our activation-statistics tool (imatrix-like, for the quantization
presets) keys on "attn_out". Qwen2 is the only architecture we ship
that does not emit it.
""",
      [E(MODEL_CPP, r"""
                        Qcur, Kcur, Vcur, nullptr, nullptr, 1.0f/sqrtf(float(n_embd_head)), il);
            }
""", r"""
                        Qcur, Kcur, Vcur, nullptr, nullptr, 1.0f/sqrtf(float(n_embd_head)), il);

                // our activation-statistics tool (behind the quantization presets) collects
                // "attn_out" for every layer; qwen2 was the only architecture we ship that
                // did not name it
                cb(cur, "attn_out", il);
            }
""", after=QWEN2_GRAPH)],
      v0_3_17=(E("src/models/qwen2.cpp", r"""
                    Qcur, Kcur, Vcur, nullptr, nullptr, nullptr, 1.0f/sqrtf(float(n_embd_head)), il);
        }
""", r"""
                    Qcur, Kcur, Vcur, nullptr, nullptr, nullptr, 1.0f/sqrtf(float(n_embd_head)), il);

            // our activation-statistics tool (behind the quantization presets) collects
            // "attn_out" for every layer; qwen2 was the only architecture we ship that
            // did not name it
            cb(cur, "attn_out", il);
        }
"""),),
      v0_3_19=(E("src/models/qwen2.cpp", r"""
                    Qcur, Kcur, Vcur, nullptr, nullptr, nullptr, 1.0f/sqrtf(float(n_embd_head)), il);
        }
""", r"""
                    Qcur, Kcur, Vcur, nullptr, nullptr, nullptr, 1.0f/sqrtf(float(n_embd_head)), il);

            // our activation-statistics tool (behind the quantization presets) collects
            // "attn_out" for every layer; qwen2 was the only architecture we ship that
            // did not name it
            cb(cur, "attn_out", il);
        }
"""),))

patch(LUCIA, "2025-09-15T10:03:55+02:00",
      "model: the 18-layer gemma3 checkpoint is gemma-3-270m",
      """
gemma-3-270m showed up as "?B" in the model info and in our model list:
it was typed LLM_TYPE_537M, which llm_type_name() does not know. There
is no 537M Gemma 3; the 18-layer variant is the 270M one. Drop the
unused type.
""",
      [E("src/llama-model.h", r"""
    LLM_TYPE_475M,
    LLM_TYPE_537M,
""", r"""
    LLM_TYPE_475M,
"""),
       E(MODEL_CPP, r"""
                    case 18: type = LLM_TYPE_537M; break;
""", r"""
                    // 18 layers: gemma-3-270m (there is no 537M Gemma 3, and LLM_TYPE_537M had
                    // no name in llm_type_name(), so the model info showed "?B")
                    case 18: type = LLM_TYPE_270M; break;
""")],
      v0_3_17=None, v0_3_19=None)

patch(TOMASZ, "2025-09-16T13:37:20+02:00",
      "arch: add the block skip connection key and tensor",
      """
Depth-upscaled SOLAR-style checkpoints carry a per-layer skip connection
weight (bskcn_tv) and the list of connected layers in
<arch>.attention.block_skip_connection. Declare both for LLM_ARCH_LLAMA,
which is what these checkpoints are converted as.
""",
      [E("src/llama-arch.h", r"""
    LLM_KV_ATTENTION_RELATIVE_BUCKETS_COUNT,
""", r"""
    LLM_KV_ATTENTION_RELATIVE_BUCKETS_COUNT,
    LLM_KV_ATTENTION_BLOCK_SKIP_CONNECTION,
"""),
       E("src/llama-arch.h", r"""
    LLM_TENSOR_ATTN_ROT_EMBD,
""", r"""
    LLM_TENSOR_ATTN_ROT_EMBD,
    LLM_TENSOR_BSKCN_TV,
"""),
       E("src/llama-arch.cpp", r"""
    { LLM_KV_ATTENTION_RELATIVE_BUCKETS_COUNT,       "%s.attention.relative_buckets_count"       },
""", r"""
    { LLM_KV_ATTENTION_RELATIVE_BUCKETS_COUNT,       "%s.attention.relative_buckets_count"       },
    { LLM_KV_ATTENTION_BLOCK_SKIP_CONNECTION,        "%s.attention.block_skip_connection"        },
"""),
       E("src/llama-arch.cpp", r"""
            { LLM_TENSOR_FFN_UP_EXPS,     "blk.%d.ffn_up_exps" },
        },
""", r"""
            { LLM_TENSOR_FFN_UP_EXPS,     "blk.%d.ffn_up_exps" },
            { LLM_TENSOR_BSKCN_TV,        "blk.%d.bskcn_tv" },
        },
""", after="        LLM_ARCH_LLAMA,\n"),
       E("src/llama-arch.cpp", r"""
    {LLM_TENSOR_ATTN_SINKS,                 {LLM_TENSOR_LAYER_REPEATING, GGML_OP_SCALE}},
""", r"""
    {LLM_TENSOR_ATTN_SINKS,                 {LLM_TENSOR_LAYER_REPEATING, GGML_OP_SCALE}},
    {LLM_TENSOR_BSKCN_TV,                   {LLM_TENSOR_LAYER_REPEATING, GGML_OP_MUL}},
""")],
      v0_3_17=None, v0_3_19=None)

patch(TOMASZ, "2025-09-16T13:52:47+02:00",
      "model: add the block skip connection weight to llama_layer",
      """
Storage for the bskcn_tv tensor declared in the previous patch and for
the per-layer list of connected layers; the loader fills them for
checkpoints that have them.
""",
      [E("src/llama-hparams.h", r"""
    float f_logit_scale    = 0.0f;

""", r"""
    float f_logit_scale    = 0.0f;

    // block skip connections (SOLAR-style depth upscaling): per connection, the layers it joins
    std::array<std::array<uint32_t, LLAMA_MAX_LAYERS>, 4> n_bskcn_arr = {};

"""),
       E("src/llama-model.h", r"""
    struct ggml_tensor * laurel_post_norm     = nullptr;

""", r"""
    struct ggml_tensor * laurel_post_norm     = nullptr;

    // block skip connection (SOLAR-style depth upscaling)
    struct ggml_tensor * bskcn_tv = nullptr;

""")],
      v0_3_17=SAME, v0_3_19=SAME)

PENALTIES_CLONE = E("src/llama-sampling.cpp", r"""
        auto * result_ctx = (llama_sampler_penalties *) result->ctx;

        result_ctx->prev = ctx->prev;
""", r"""
        auto * result_ctx = (llama_sampler_penalties *) result->ctx;

        // token_count is derived from prev: without it the clone applies no frequency or
        // presence penalty until the ring buffer has been refilled
        result_ctx->prev        = ctx->prev;
        result_ctx->token_count = ctx->token_count;
""")

patch(DEV, "2025-09-17T09:25:14-07:00",
      "sampling: copy the token counts when cloning the penalties sampler",
      """
llama_sampler_clone() on a penalties sampler copied the ring buffer of
previous tokens but not the per-token counts derived from it, so the
clone applied no frequency/presence penalty until the buffer wrapped.
""",
      [PENALTIES_CLONE],
      v0_3_17=(moved(PENALTIES_CLONE, "src/llama-sampler.cpp"),),
      v0_3_19=(moved(PENALTIES_CLONE, "src/llama-sampler.cpp"),))

XTC_RENORM = E("src/llama-sampling.cpp", r"""
        cur_p->data += pos_last;
        cur_p->size -= pos_last;
    }
""", r"""
        cur_p->data += pos_last;
        cur_p->size -= pos_last;

        // the remaining candidates no longer sum to 1: renormalise, so that samplers
        // reading .p afterwards (typical-p, and the logprobs we return to clients) see a
        // proper distribution
        llama_sampler_softmax_impl(cur_p);
    }
""")

patch(DEV, "2025-09-17T14:48:31-07:00",
      "sampling: renormalise the candidates after XTC removed the top ones",
      """
XTC drops the most likely candidates but leaves the probabilities of the
rest untouched. Samplers that read .p afterwards (our typical-p and the
logprobs we return to clients) then see a distribution that does not
sum to one.
""",
      [XTC_RENORM],
      v0_3_17=(moved(XTC_RENORM, "src/llama-sampler.cpp"),),
      v0_3_19=(moved(XTC_RENORM, "src/llama-sampler.cpp"),))

patch(LUCIA, "2025-09-18T11:12:08+02:00",
      "model-saver: fix the MoE metadata of saved models",
      """
llama_model_save_to_file() wrote n_ff_exp as the shared expert feed
forward length and left out the expert weight normalisation, the gating
function, the MoE layer step and the NextN layer count, so saved
Qwen2-MoE and GLM-4.5 models loaded with the wrong routing.
""",
      [E("src/llama-model-saver.cpp", r"""
    add_kv(LLM_KV_EXPERT_SHARED_FEED_FORWARD_LENGTH, hparams.n_ff_exp);
""", r"""
    add_kv(LLM_KV_EXPERT_SHARED_FEED_FORWARD_LENGTH, hparams.n_ff_shexp);
"""),
       E("src/llama-model-saver.cpp", r"""
    add_kv(LLM_KV_EXPERT_WEIGHTS_SCALE,              hparams.expert_weights_scale);
""", r"""
    add_kv(LLM_KV_EXPERT_WEIGHTS_SCALE,              hparams.expert_weights_scale);
    add_kv(LLM_KV_EXPERT_WEIGHTS_NORM,               hparams.expert_weights_norm);
    add_kv(LLM_KV_EXPERT_GATING_FUNC,                hparams.expert_gating_func);
    add_kv(LLM_KV_MOE_EVERY_N_LAYERS,                hparams.moe_every_n_layers);
    add_kv(LLM_KV_NEXTN_PREDICT_LAYERS,              hparams.nextn_predict_layers);
""")],
      v0_3_17=SAME, v0_3_19=None)

patch(LUCIA, "2025-09-18T15:40:44+02:00",
      "model-saver: keep the WavTokenizer sizes and the classifier labels",
      """
WavTokenizer models saved with llama_model_save_to_file() lost their
PosNet/ConvNeXt sizes, and rerankers/classifiers their label names;
write them back.
""",
      [E("src/llama-model-saver.cpp", r"""
    // add_kv(LLM_KV_ADAPTER_LORA_ALPHA,                ???);

""", r"""
    // add_kv(LLM_KV_ADAPTER_LORA_ALPHA,                ???);

    add_kv(LLM_KV_POSNET_EMBEDDING_LENGTH,           hparams.posnet.n_embd);
    add_kv(LLM_KV_POSNET_BLOCK_COUNT,                hparams.posnet.n_layer);

    add_kv(LLM_KV_CONVNEXT_EMBEDDING_LENGTH,         hparams.convnext.n_embd);
    add_kv(LLM_KV_CONVNEXT_BLOCK_COUNT,              hparams.convnext.n_layer);

    add_kv(LLM_KV_CLASSIFIER_OUTPUT_LABELS,          model.classifier_labels);

""")],
      v0_3_17=SAME, v0_3_19=None)

RECURRENT_SEQ_ID = E("src/llama-memory-recurrent.cpp", r"""
                // TODO: llama_memory_recurrent should have a notion of max sequences
                //if (seq_id < 0 || (uint32_t) seq_id >= llama_n_seq_max(ctx)) {
                if (seq_id < 0) {
                    //LLAMA_LOG_ERROR("%s: invalid seq_id, %d is out of range [0, %u)\n", __func__, seq_id, llama_n_seq_max(ctx));
                    LLAMA_LOG_ERROR("%s: invalid seq_id, %d is out of range [0, inf)\n", __func__, seq_id);
                    return false;
                }
""", r"""
                if (seq_id < 0 || (uint32_t) seq_id >= this->n_seq_max) {
                    LLAMA_LOG_ERROR("%s: invalid seq_id, %d is out of range [0, %u)\n", __func__, seq_id, this->n_seq_max);
                    return false;
                }
""")
RECURRENT_DEST = E("src/llama-memory-recurrent.cpp", r"""
bool llama_memory_recurrent::state_read_meta(llama_io_read_i & io, uint32_t cell_count, llama_seq_id dest_seq_id) {
    if (dest_seq_id != -1) {
""", r"""
bool llama_memory_recurrent::state_read_meta(llama_io_read_i & io, uint32_t cell_count, llama_seq_id dest_seq_id) {
    if (dest_seq_id != -1 && (uint32_t) dest_seq_id >= n_seq_max) {
        LLAMA_LOG_ERROR("%s: dest_seq_id %d is out of range [0, %u)\n", __func__, dest_seq_id, n_seq_max);
        return false;
    }

    if (dest_seq_id != -1) {
""")

patch(INES, "2025-09-19T10:58:21+01:00",
      "memory-recurrent: bound sequence ids by n_seq_max when restoring state",
      """
Restoring a saved recurrent state with more sequences than the context
was created with wrote past cells[] (tail lookup by seq_id). Check both
the destination sequence and the ids stored in the state.
""",
      [RECURRENT_DEST, RECURRENT_SEQ_ID],
      v0_3_17=SAME, v0_3_19=(RECURRENT_DEST,))

patch(MARA, "2025-09-22T14:21:36+02:00",
      "model-loader: print the tensor data size with the metadata summary",
      """
The first log line about a model is the one people paste into bug
reports; make it say how big the tensor data is.
""",
      [E("src/llama-model-loader.cpp", r"""
    LLAMA_LOG_INFO("%s: loaded meta data with %d key-value pairs and %d tensors from %s (version %s)\n",
            __func__, n_kv, n_tensors, fname.c_str(), llama_file_version_name(fver));
""", r"""
    // the first line people paste into bug reports: make it say how big the tensor data is
    LLAMA_LOG_INFO("%s: loaded meta data with %d key-value pairs and %d tensors (%.2f MiB) from %s (version %s)\n",
            __func__, n_kv, n_tensors, n_bytes/1024.0/1024.0, fname.c_str(), llama_file_version_name(fver));
""")],
      v0_3_17=SAME,
      # 0.3.19 rewrote the file-name argument: the edit redone on the new line, keeping it
      v0_3_19=(E("src/llama-model-loader.cpp", r"""
    LLAMA_LOG_INFO("%s: loaded meta data with %d key-value pairs and %d tensors from %s (version %s)\n",
            __func__, n_kv, n_tensors, fname.empty() ? "(file*)" : fname.c_str(), llama_file_version_name(fver));
""", r"""
    // the first line people paste into bug reports: make it say how big the tensor data is
    LLAMA_LOG_INFO("%s: loaded meta data with %d key-value pairs and %d tensors (%.2f MiB) from %s (version %s)\n",
            __func__, n_kv, n_tensors, n_bytes/1024.0/1024.0, fname.empty() ? "(file*)" : fname.c_str(), llama_file_version_name(fver));
"""),))

patch(DEV, "2025-09-23T08:34:57-07:00",
      "ggml-opt: reject negative batch indices",
      """
ggml_opt_dataset_get_batch() and its host variant only checked the upper
bound of ibatch; a negative index from the training loop read before the
permutation. Check both bounds in one helper.
""",
      [E("ggml/src/ggml-opt.cpp", r"""
void ggml_opt_dataset_get_batch(ggml_opt_dataset_t dataset, struct ggml_tensor * data_batch, struct ggml_tensor * labels_batch, int64_t ibatch) {
""", r"""
static void ggml_opt_dataset_check_batch(ggml_opt_dataset_t dataset, int64_t ibatch, int64_t shards_per_batch) {
    GGML_ASSERT(ibatch >= 0);
    GGML_ASSERT((ibatch + 1)*shards_per_batch <= int64_t(dataset->permutation.size()));
}

void ggml_opt_dataset_get_batch(ggml_opt_dataset_t dataset, struct ggml_tensor * data_batch, struct ggml_tensor * labels_batch, int64_t ibatch) {
"""),
       E("ggml/src/ggml-opt.cpp", r"""
        GGML_ASSERT(nb_labels_batch == shards_per_batch*dataset->nbs_labels);
    }

    GGML_ASSERT((ibatch + 1)*shards_per_batch <= int64_t(dataset->permutation.size()));
""", r"""
        GGML_ASSERT(nb_labels_batch == shards_per_batch*dataset->nbs_labels);
    }

    ggml_opt_dataset_check_batch(dataset, ibatch, shards_per_batch);
"""),
       E("ggml/src/ggml-opt.cpp", r"""
    const int64_t shards_per_batch = nb_data_batch / dataset->nbs_data;

    GGML_ASSERT((ibatch + 1)*shards_per_batch <= int64_t(dataset->permutation.size()));
""", r"""
    const int64_t shards_per_batch = nb_data_batch / dataset->nbs_data;

    ggml_opt_dataset_check_batch(dataset, ibatch, shards_per_batch);
""")],
      v0_3_17=SAME, v0_3_19=SAME)

patch(LUCIA, "2025-09-24T10:15:42+02:00",
      "llama: add llama_clear_adapter_cvec()",
      """
Clearing a control vector means calling llama_apply_adapter_cvec() with a
NULL buffer and zero sizes, which every binding gets wrong at least once.
Add an explicit entry point.
""",
      [E(LLAMA_H, r"""
                         int32_t   il_start,
                         int32_t   il_end);

""", r"""
                         int32_t   il_start,
                         int32_t   il_end);

    // Remove the control vector from the context (same as applying a NULL vector)
    LLAMA_API int32_t llama_clear_adapter_cvec(struct llama_context * ctx);

"""),
       E(CONTEXT_CPP, r"""
    return res ? 0 : -1;
}

//
// memory
//
""", r"""
    return res ? 0 : -1;
}

int32_t llama_clear_adapter_cvec(llama_context * ctx) {
    return llama_apply_adapter_cvec(ctx, nullptr, 0, 0, 0, 0);
}

//
// memory
//
""")],
      v0_3_17=SAME, v0_3_19=SAME)

patch(MARA, "2025-09-25T16:02:10+02:00",
      "context: print the overall throughput in the perf summary",
      """
Benchmarks compare one number: tokens per second over the whole run,
prompt and generation together. Print it so that nobody has to compute
it from the three lines above.
""",
      [E(CONTEXT_CPP, r"""
    LLAMA_LOG_INFO("%s:    graphs reused = %10d\n", __func__, data.n_reused);
""", r"""
    const double t_total_ms = t_end_ms - data.t_start_ms;
    if (t_total_ms > 0.0) {
        LLAMA_LOG_INFO("%s:       throughput = %10.2f tokens per second\n", __func__,
                1e3 * (data.n_p_eval + data.n_eval) / t_total_ms);
    }
    LLAMA_LOG_INFO("%s:    graphs reused = %10d\n", __func__, data.n_reused);
""")],
      v0_3_17=SAME, v0_3_19=SAME)

patch(INES, "2025-09-29T09:47:33+01:00",
      "ggml: say so when a tensor name is truncated",
      """
Per-layer tensor names built by the model loader can exceed
GGML_MAX_NAME; the silently truncated names then collide in the
scheduler's debug output. Log truncations in ggml_set_name() and
ggml_format_name() at debug level.
""",
      [E(GGML_C, r"""
        tensor->name[i] = name[i];
    }
    tensor->name[i] = '\0';
    return tensor;
""", r"""
        tensor->name[i] = name[i];
    }
    tensor->name[i] = '\0';
    if (name[i] != '\0') {
        GGML_LOG_DEBUG("%s: tensor name truncated to '%s'\n", __func__, tensor->name);
    }
    return tensor;
"""),
       E(GGML_C, r"""
    va_start(args, fmt);
    vsnprintf(tensor->name, sizeof(tensor->name), fmt, args);
    va_end(args);
    return tensor;
""", r"""
    va_start(args, fmt);
    const int n = vsnprintf(tensor->name, sizeof(tensor->name), fmt, args);
    va_end(args);
    if (n >= (int) sizeof(tensor->name)) {
        GGML_LOG_DEBUG("%s: tensor name truncated to '%s'\n", __func__, tensor->name);
    }
    return tensor;
""", after="struct ggml_tensor * ggml_format_name(")],
      v0_3_17=SAME, v0_3_19=SAME)

patch(DEV, "2025-10-01T11:26:05-07:00",
      "ggml-backend: report the graph size when scheduling buffers fails",
      """
"failed to allocate compute buffers" alone does not tell whether the
graph or the device is too big. Log node and split counts of the graph
that could not be reserved or allocated.
""",
      [E("ggml/src/ggml-backend.cpp", r"""
    if (!ggml_gallocr_reserve_n(sched->galloc, &sched->graph, sched->node_backend_ids, sched->leaf_backend_ids)) {
        return false;
    }

    ggml_backend_sched_reset(sched);
""", r"""
    if (!ggml_gallocr_reserve_n(sched->galloc, &sched->graph, sched->node_backend_ids, sched->leaf_backend_ids)) {
        // callers only say that allocation failed: say for which graph
        GGML_LOG_ERROR("%s: failed to reserve buffers for a graph with %d nodes in %d splits\n",
                __func__, sched->graph.n_nodes, sched->n_splits);
        return false;
    }

    ggml_backend_sched_reset(sched);
"""),
       E("ggml/src/ggml-backend.cpp", r"""
    if (!ggml_backend_sched_alloc_splits(sched)) {
        return false;
    }
""", r"""
    if (!ggml_backend_sched_alloc_splits(sched)) {
        GGML_LOG_ERROR("%s: failed to allocate a graph with %d nodes in %d splits\n",
                __func__, sched->graph.n_nodes, sched->n_splits);
        return false;
    }
""")],
      v0_3_17=SAME, v0_3_19=SAME)

# --------------------------------------------------------------------------------------------
# Machinery
# --------------------------------------------------------------------------------------------

def tree(version: str) -> Path:
    path = CACHE / "trees" / f"llama-cpp-python-{version}" / "vendor" / "llama.cpp"
    if not (path / "src").is_dir():
        sys.exit(f"make_series: no llama.cpp tree for {version} at {path} (fetch it with portkit)")
    return path


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    isolated = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    full_env = {**os.environ, **isolated, **(env or {})}
    cmd = ["git", "-c", "core.autocrlf=false", "-c", "user.name=Fork Series", "-c",
           "user.email=fork-series@forge.example.org", *args]
    done = subprocess.run(cmd, cwd=repo, env=full_env, check=True, capture_output=True, text=True)
    return done.stdout


def init_repo(version: str, work: Path) -> Path:
    repo = work / version
    source = tree(version)
    # the sdist tree has a .git file (submodule pointer) at its top: leave it out
    shutil.copytree(source, repo, ignore=lambda d, names: [".git"] if Path(d) == source else [])
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A", "-f")
    stamp = "2025-08-14T00:00:00+00:00"
    git(repo, "commit", "-q", "-m", f"llama.cpp {COMMITS[version]} (llama-cpp-python {version})",
        env={"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp})
    return repo


def apply_edits(repo: Path, edits: tuple[Edit, ...], where: str) -> None:
    for edit in edits:
        path = repo / edit.path
        text = path.read_text(encoding="utf-8")
        if edit.after:
            if text.count(edit.after) != 1:
                count = text.count(edit.after)
                sys.exit(f"make_series: {where}: anchor found {count} times in {edit.path}")
            at = text.find(edit.old, text.index(edit.after))
            found = 0 if at < 0 else 1
        else:
            found, at = text.count(edit.old), text.find(edit.old)
        if found != 1:
            sys.exit(f"make_series: {where}: old text found {found} times in {edit.path}:\n"
                     f"{edit.old}")
        path.write_text(text[:at] + edit.new + text[at + len(edit.old):], encoding="utf-8")


def commit(repo: Path, p: Patch) -> None:
    name, email = p.author[:-1].split(" <")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"{p.subject}\n\n{p.body}",
        env={"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
             "GIT_AUTHOR_DATE": p.date, "GIT_COMMITTER_DATE": p.date})


def build(version: str, work: Path, out: Path) -> None:
    repo = init_repo(version, work)
    base = git(repo, "rev-parse", "HEAD").strip()
    out.mkdir(parents=True, exist_ok=True)
    for number, p in enumerate(PATCHES, start=1):
        if version == BASE:
            edits: object = p.edits
        else:
            edits = p.edits if p.targets[version] == SAME else p.targets[version]
        if edits is None:
            continue
        assert isinstance(edits, tuple)
        apply_edits(repo, edits, f"{version} patch {number} ({p.subject})")
        commit(repo, p)
        if version != BASE:
            git(repo, *FORMAT_PATCH, f"--start-number={number}", "-o", str(out), "-1", "HEAD")
    if version == BASE:
        git(repo, *FORMAT_PATCH, "-o", str(out), base)


def generate(dest: Path, keep: Path | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="fork-series-") as tmp:
        work = keep or Path(tmp)
        build(BASE, work, dest / "series")
        for version in TARGETS:
            build(version, work, dest / "expected" / version)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="regenerate elsewhere and compare")
    parser.add_argument("--keep", type=Path, help="keep the throw-away repositories in this directory")
    args = parser.parse_args()
    if args.keep is not None and args.keep.exists():
        parser.error(f"{args.keep} exists")
    if args.check:
        with tempfile.TemporaryDirectory(prefix="fork-series-check-") as tmp:
            generate(Path(tmp), args.keep)
            diffs = []
            for sub in ["series", *(f"expected/{v}" for v in TARGETS)]:
                cmp = filecmp.dircmp(Path(tmp) / sub, HERE / sub)
                diffs += [f"{sub}/{n}" for n in cmp.left_only + cmp.right_only + cmp.diff_files]
                _, mismatch, errors = filecmp.cmpfiles(
                    Path(tmp) / sub, HERE / sub, cmp.common_files, shallow=False)
                diffs += [f"{sub}/{n}" for n in mismatch + errors]
            for d in sorted(set(diffs)):
                print(f"differs: {d}")
            return 1 if diffs else 0
    for sub in ["series", "expected"]:
        shutil.rmtree(HERE / sub, ignore_errors=True)
    generate(HERE, args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
