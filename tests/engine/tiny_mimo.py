"""The tiny MiMo MTP model's maths in torch, the same as vLLM's Qwen2 and MiMo MTP code runs it,
and an offline check of how often its draft agrees with its own greedy output.

Used by tiny_model.py (training) only; vLLM serves the exported weights with its own code.
"""

from __future__ import annotations


def make_model(s: dict):
    import torch
    from torch import nn
    from torch.nn import functional as F

    H, FF = s["hidden_size"], s["intermediate_size"]
    nh, nkv, hd = s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"]

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):
            var = x.float().pow(2).mean(-1, keepdim=True)
            return (x.float() * torch.rsqrt(var + s["rms_norm_eps"])) * self.weight

    def rope(x, pos):  # x [B, heads, T, hd], pos [T] or [B, T]; neox style (rotate halves)
        inv = 1.0 / (s["rope_theta"] ** (torch.arange(0, hd, 2, device=x.device).float() / hd))
        ang = pos.float()[..., None] * inv  # [..., T, hd/2]
        if ang.dim() == 2:
            ang = ang[None, None]
        else:
            ang = ang[:, None]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    class Block(nn.Module):  # Qwen2DecoderLayer
        def __init__(self) -> None:
            super().__init__()
            self.input_layernorm = RMSNorm()
            self.post_attention_layernorm = RMSNorm()
            self.self_attn = nn.Module()
            self.self_attn.q_proj = nn.Linear(H, nh * hd, bias=True)
            self.self_attn.k_proj = nn.Linear(H, nkv * hd, bias=True)
            self.self_attn.v_proj = nn.Linear(H, nkv * hd, bias=True)
            self.self_attn.o_proj = nn.Linear(nh * hd, H, bias=False)
            self.mlp = nn.Module()
            self.mlp.gate_proj = nn.Linear(H, FF, bias=False)
            self.mlp.up_proj = nn.Linear(H, FF, bias=False)
            self.mlp.down_proj = nn.Linear(FF, H, bias=False)

        def forward(self, x, pos, past=None, mask=None):
            """x [B,T,H] at positions pos [T]; `past` = keys/values of earlier tokens this
            block's queries may also see (through `mask` [T, T_past + T]); returns the output
            and this call's own keys/values."""
            B, T, _ = x.shape
            a = self.self_attn
            h = self.input_layernorm(x)
            q = a.q_proj(h).view(B, T, nh, hd).transpose(1, 2)
            k = a.k_proj(h).view(B, T, nkv, hd).transpose(1, 2)
            v = a.v_proj(h).view(B, T, nkv, hd).transpose(1, 2)
            q, k = rope(q, pos), rope(k, pos)
            own = (k, v)
            if past is not None:
                k = torch.cat([past[0], k], 2)
                v = torch.cat([past[1], v], 2)
            k = k.repeat_interleave(nh // nkv, 1)
            v = v.repeat_interleave(nh // nkv, 1)
            if mask is None:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + a.o_proj(o.transpose(1, 2).reshape(B, T, nh * hd))
            m = self.mlp
            h = self.post_attention_layernorm(x)
            return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h)), own

    class MTPLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.token_layernorm = RMSNorm()
            self.hidden_layernorm = RMSNorm()
            self.input_proj = nn.Linear(2 * H, H, bias=False)
            self.block = Block()
            self.final_layernorm = RMSNorm()

    class TinyMiMo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(s["vocab_size"], H)
            self.layers = nn.ModuleList(Block() for _ in range(s["trained_layers"]))
            self.norm = RMSNorm()
            self.lm_head = nn.Linear(H, s["vocab_size"], bias=False)
            self.mtp = MTPLayer()
            for mod in self.modules():
                if isinstance(mod, nn.Linear):
                    nn.init.normal_(mod.weight, std=0.02)
                    if mod.bias is not None:
                        nn.init.zeros_(mod.bias)
                elif isinstance(mod, nn.Embedding):
                    nn.init.normal_(mod.weight, std=0.02)

        def forward(self, ids, n_steps: int):
            """Main logits [B,T,V] and, per draft step r = 1..n_steps, logits [B,T,V] where
            position p predicts token p+r+1 (the last r+1 positions have no target)."""
            T = ids.shape[1]
            pos = torch.arange(T, device=ids.device)
            x = self.embed_tokens(ids)
            for layer in self.layers:
                x, _ = layer(x, pos)
            main = self.lm_head(self.norm(x))
            mtp = self.mtp
            # Draft step 1 at position p: (pre-norm h_p, embed(x_{p+1})), the embedding zeroed
            # at position 0 as vLLM does. Step r+1 at position p+r: (its own normed output at
            # p, embed(x_{p+r+1})); it sees step 1's keys of positions <= p (the draft's KV
            # cache) and the keys of its own chain (earlier steps for the same p).
            e_next = self.embed_tokens(torch.roll(ids, -1, 1))
            e_next = e_next * (pos > 0).to(e_next.dtype)[None, :, None]
            prev, past, outs = x, None, []
            for r in range(n_steps):
                if r > 0:
                    e_next = self.embed_tokens(torch.roll(ids, -(r + 1), 1))
                u = mtp.input_proj(torch.cat([mtp.hidden_layernorm(prev),
                                              mtp.token_layernorm(e_next)], -1))
                out, own = mtp.block(u, pos + r, past, self._mask(r, T, ids.device))
                past = own if past is None else (torch.cat([past[0], own[0]], 2),
                                                 torch.cat([past[1], own[1]], 2))
                prev = mtp.final_layernorm(out)
                outs.append(self.lm_head(prev))
            return main, outs

        @staticmethod
        def _mask(r: int, T: int, dev):
            """[T, (r+1)T] for draft step r+1: keys of step 1 at bases <= p, and of steps
            2..r+1 for the same base p."""
            if r == 0:
                return None
            qb = torch.arange(T, device=dev)[:, None]
            kb = torch.arange(T, device=dev)[None, :]
            first = kb <= qb
            chain = (kb == qb).repeat(1, r)
            return torch.cat([first, chain], 1)

    return TinyMiMo()




def draft_agreement(model, prompts: list[list[int]], new_tokens: int, k: int, device: str
                    ) -> list[float]:
    """Greedy-generate `new_tokens` after each prompt, then measure, over the generated part,
    how often draft step j (j = 1..k, conditional on steps < j being right) predicts the token
    the target itself chose: an offline estimate of the engine's acceptance by position."""
    import torch

    model.eval()
    with torch.no_grad():
        seq = torch.tensor(prompts, device=device)
        for _ in range(new_tokens):
            main, _ = model(seq, 0)
            seq = torch.cat([seq, main[:, -1].argmax(-1, keepdim=True)], 1)
        _, outs = model(seq, k)
        L, T = len(prompts[0]), seq.shape[1]
        # draft at base p (input: target state at p, token p+1) proposes p+2, p+3, ...
        bases = range(L - 1, T - k - 1)
        hits = [0] * k
        total = 0
        for p in bases:
            for b in range(seq.shape[0]):
                total += 1
                for j in range(k):
                    if outs[j][b, p].argmax().item() != seq[b, p + j + 2].item():
                        break
                    hits[j] += 1
    model.train()
    return [h / total for h in hits]
