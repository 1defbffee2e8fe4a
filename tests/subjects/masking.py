"""Users' masked-LM data functions: d2l's (as the chapter writes it), and the bug of d2l <= 0.17.0 whose
random-token branch drew an index where a token was meant (d2l-en PR 1979)."""

import random


def _replace_mlm_tokens(tokens, candidate_pred_positions, num_mlm_preds, vocab, draw_index=False):
    mlm_input_tokens = [token for token in tokens]
    pred_positions_and_labels = []
    random.shuffle(candidate_pred_positions)
    for mlm_pred_position in candidate_pred_positions:
        if len(pred_positions_and_labels) >= num_mlm_preds:
            break
        if random.random() < 0.8:
            masked_token = "<mask>"
        elif random.random() < 0.5:
            masked_token = tokens[mlm_pred_position]
        elif draw_index:
            masked_token = random.randint(0, len(vocab) - 1)
        else:
            masked_token = random.choice(vocab.idx_to_token)
        mlm_input_tokens[mlm_pred_position] = masked_token
        pred_positions_and_labels.append((mlm_pred_position, tokens[mlm_pred_position]))
    return mlm_input_tokens, pred_positions_and_labels


def get_mlm_data_from_tokens(tokens, vocab, draw_index=False):
    candidate_pred_positions = [i for i, token in enumerate(tokens) if token not in ("<cls>", "<sep>")]
    num_mlm_preds = max(1, round(len(tokens) * 0.15))
    mlm_input_tokens, pred_positions_and_labels = _replace_mlm_tokens(
        tokens, candidate_pred_positions, num_mlm_preds, vocab, draw_index
    )
    pred_positions_and_labels = sorted(pred_positions_and_labels, key=lambda x: x[0])
    pred_positions = [v[0] for v in pred_positions_and_labels]
    mlm_pred_labels = [v[1] for v in pred_positions_and_labels]
    return vocab[mlm_input_tokens], pred_positions, vocab[mlm_pred_labels]


def with_randint(tokens, vocab):
    return get_mlm_data_from_tokens(tokens, vocab, draw_index=True)


def always_mask(tokens, vocab):
    ids, positions, labels = get_mlm_data_from_tokens(tokens, vocab)
    return [vocab["<mask>"] if i in positions else t for i, t in enumerate(ids)], positions, labels
