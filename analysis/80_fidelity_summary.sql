-- fidelity_summary: per fidelity comparison x candidate variant, how close the candidate's greedy
-- outputs are to the baseline's (table fidelity, one row per prompt; written by `servelab
-- fidelity` and by `servelab matrix --fidelity`).
--   prompts = rows; exact_matches = prompts whose token sequences are identical;
--   exact_match_rate = exact_matches / prompts;
--   mean_first_divergence, median_first_divergence = over the prompts that differ, the first
--     differing token position (0-based; 0 also for a prompt whose request failed);
--   mean_similarity = mean difflib ratio over token ids (0..1; identical outputs count 1);
--   token_source = 'server' when every row was tokenized by the servers' /tokenize, else 'words';
--   matrix_id = the matrix the comparison belongs to (NULL for `servelab fidelity`).
CREATE OR REPLACE VIEW fidelity_summary AS
SELECT
    fidelity_id,
    any_value(matrix_id) AS matrix_id,
    any_value(baseline) AS baseline,
    candidate,
    any_value(backend) AS backend,
    any_value(hardware) AS hardware,
    any_value(prompt_set) AS prompt_set,
    min(created_unix) AS created_unix,
    count(*) AS prompts,
    count(*) FILTER (WHERE exact_match) AS exact_matches,
    avg(exact_match::INTEGER) AS exact_match_rate,
    avg(first_divergence) FILTER (WHERE NOT exact_match) AS mean_first_divergence,
    median(first_divergence) FILTER (WHERE NOT exact_match) AS median_first_divergence,
    avg(similarity) AS mean_similarity,
    CASE WHEN bool_and(token_source = 'server') THEN 'server' ELSE 'words' END AS token_source
FROM fidelity
GROUP BY fidelity_id, candidate;
