# Cyang-Zhao/Grad-Eclip @ 5c1b5cc (see the commit named in tests/test_prompts.py), generate_emap.py:
# `attention_layer`, `clip_encode_dense` and `grad_eclip` copied verbatim except that `x.half()` is
# commented out (float32 on the CPU). `clipmodel` is the module global the script's functions read; the
# test sets it to an OpenAI-layout CLIP. Quoted for testing only, with attribution; the repository
# states no licence.
import torch
import torch.nn.functional as F

clipmodel = None


def attention_layer(q, k, v, num_heads=1, attn_mask=None):
    "Compute 'Scaled Dot Product Attention'"
    tgt_len, bsz, embed_dim = q.shape
    head_dim = embed_dim // num_heads
    scaling = float(head_dim) ** -0.5
    q = q * scaling
    
    q = q.contiguous().view(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = k.contiguous().view(-1, bsz * num_heads, head_dim).transpose(0, 1)
    v = v.contiguous().view(-1, bsz * num_heads, head_dim).transpose(0, 1)
    attn_output_weights = torch.bmm(q, k.transpose(1, 2))
    if attn_mask is not None:
        attn_output_weights += attn_mask
    attn_output_weights = F.softmax(attn_output_weights, dim=-1)
    attn_output_heads = torch.bmm(attn_output_weights, v)
    assert list(attn_output_heads.size()) == [bsz * num_heads, tgt_len, head_dim]
    attn_output = attn_output_heads.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
    attn_output_weights = attn_output_weights.view(bsz, num_heads, tgt_len, -1)
    attn_output_weights = attn_output_weights.sum(dim=1) / num_heads
    return attn_output, attn_output_weights


def clip_encode_dense(x):
    vision_width = clipmodel.visual.transformer.width
    vision_heads = vision_width // 64
    clip_inres = clipmodel.visual.input_resolution
    clip_ksize = clipmodel.visual.conv1.kernel_size
    
    # modified from CLIP
    # x = x.half()  (the tests run in float32 on the CPU)
    x = clipmodel.visual.conv1(x)  
    feah, feaw = x.shape[-2:]

    x = x.reshape(x.shape[0], x.shape[1], -1) 
    x = x.permute(0, 2, 1) 
    class_embedding = clipmodel.visual.class_embedding.to(x.dtype)

    x = torch.cat([class_embedding + torch.zeros(x.shape[0], 1, x.shape[-1]).to(x), x], dim=1)

    pos_embedding = clipmodel.visual.positional_embedding.to(x.dtype)
    tok_pos, img_pos = pos_embedding[:1, :], pos_embedding[1:, :]
    pos_h = clip_inres // clip_ksize[0]
    pos_w = clip_inres // clip_ksize[1]
    assert img_pos.size(0) == (pos_h * pos_w), f"the size of pos_embedding ({img_pos.size(0)}) does not match resolution shape pos_h ({pos_h}) * pos_w ({pos_w})"
    img_pos = img_pos.reshape(1, pos_h, pos_w, img_pos.shape[1]).permute(0, 3, 1, 2)
    img_pos = torch.nn.functional.interpolate(img_pos, size=(feah, feaw), mode='bicubic', align_corners=False)
    img_pos = img_pos.reshape(1, img_pos.shape[1], -1).permute(0, 2, 1)
    pos_embedding = torch.cat((tok_pos[None, ...], img_pos), dim=1)
    x = x + pos_embedding
    x = clipmodel.visual.ln_pre(x)
    
    x = x.permute(1, 0, 2)  # NLD -> LND
    x_in = torch.nn.Sequential(*clipmodel.visual.transformer.resblocks[:-1])(x)

    ##################
    # LastTR.attention
    targetTR = clipmodel.visual.transformer.resblocks[-1]
    x_before_attn = targetTR.ln_1(x_in)
    
    linear = torch._C._nn.linear    
    q, k, v = linear(x_before_attn, targetTR.attn.in_proj_weight, targetTR.attn.in_proj_bias).chunk(3, dim=-1)
    attn_output, attn = attention_layer(q, k, v, 1) #vision_heads
    x_after_attn = linear(attn_output, targetTR.attn.out_proj.weight, targetTR.attn.out_proj.bias)
    
    x = x_after_attn + x_in
    x_out = x + targetTR.mlp(targetTR.ln_2(x))

    x = x_out.permute(1, 0, 2)  # LND -> NLD
    x = clipmodel.visual.ln_post(x)
    x = x @ clipmodel.visual.proj
    
    ## ==== get lastv ==============
    with torch.no_grad():
        qkv = torch.stack((q, k, v), dim=0)
        qkv = linear(qkv, targetTR.attn.out_proj.weight, targetTR.attn.out_proj.bias)
        q_out, k_out, v_out = qkv[0], qkv[1], qkv[2]

        v_final = v_out + x_in
        v_final = v_final + targetTR.mlp(targetTR.ln_2(v_final))
        v_final = v_final.permute(1, 0, 2)
        v_final = clipmodel.visual.ln_post(v_final)
        v_final = v_final @ clipmodel.visual.proj
    ##############
    
    return x, v_final[:,1:], x_in, v, q_out, k_out, attn, attn_output, (feah, feaw)


def grad_eclip(c, q_out, k_out, v, att_output, map_size, withksim=True):
    D = k_out.shape[-1]
    ## gradient on last attention output
    grad = torch.autograd.grad(
        c,
        att_output,
        retain_graph=True)[0]
    grad = grad.detach()
    grad_cls = grad[:1,0,:]
    if withksim:
        q_cls = q_out[:1,0,:]
        k_patch = k_out[1:,0,:]
        q_cls = F.normalize(q_cls, dim=-1)
        k_patch = F.normalize(k_patch, dim=-1)
        cosine_qk = (q_cls * k_patch).sum(-1) 
        cosine_qk = (cosine_qk-cosine_qk.min()) / (cosine_qk.max()-cosine_qk.min())
        emap_lastv = F.relu_((grad_cls * v[1:,0,:] * cosine_qk[:,None]).detach().sum(-1)) # 
    else:
        emap_lastv = F.relu_((grad_cls * v[1:,0,:]).detach().sum(-1)) 
    return emap_lastv.reshape(*map_size)
