;;; Drives caret lsp from Emacs's eglot (1.9+, Debian 12's elpa-eglot): completion through
;;; eglot's own completion-at-point, then caret.apply (eglot applies the server's edit).
;;; emacs --batch -l emacs-eglot.el   with CARET_BIN, WS (holding shapes.py) and OUT set.
(require 'eglot)
(require 'python)
(setq eglot-sync-connect 120
      eglot-connect-timeout 120
      eglot-confirm-server-initiated-edits nil
      jsonrpc-default-request-timeout 120)
(let* ((caret (getenv "CARET_BIN"))
       (file (expand-file-name "shapes.py" (getenv "WS")))
       (lines '()))
  (add-to-list 'eglot-server-programs
               `(python-mode . (,caret "lsp" :initializationOptions (:debounce_ms 0))))
  (find-file file)
  (python-mode)
  (apply #'eglot (eglot--guess-contact))
  ;; The connection completes asynchronously (the model loads during `initialize`).
  (let ((deadline (+ (float-time) 120)))
    (while (and (< (float-time) deadline) (not (eglot-current-server)))
      (accept-process-output nil 0.1)))
  (push (format "connected: %s" (and (eglot-current-server) t)) lines)
  ;; Cursor at the end of `    p = ` (line 11).
  (goto-char (point-min))
  (forward-line 10)
  (end-of-line)
  (let* ((started (float-time))
         (capf (eglot-completion-at-point))
         (items (and capf (all-completions "" (nth 2 capf)))))
    (push (format "completion (%.0f ms): %S" (* 1000 (- (float-time) started)) items) lines))
  (let ((edit "<<<<<<< SEARCH\n    return 2 * (w + h)\n=======\n    return 2 * w + 2 * h\n>>>>>>> REPLACE\n"))
    (eglot-execute-command (eglot-current-server) "caret.apply"
                           (vector (list :uri (eglot--path-to-uri file) :edit edit))))
  (let ((deadline (+ (float-time) 5)))
    (while (and (< (float-time) deadline)
                (not (save-excursion (goto-char (point-min)) (search-forward "2 * w + 2 * h" nil t))))
      (accept-process-output nil 0.05)))
  (push (format "line 6 now: %s" (save-excursion (goto-char (point-min)) (forward-line 5)
                                                  (buffer-substring (point) (line-end-position))))
        lines)
  (with-temp-file (getenv "OUT") (insert (mapconcat #'identity (nreverse lines) "\n") "\n"))
  (eglot-shutdown (eglot-current-server))
  (set-buffer-modified-p nil)
  (kill-emacs 0))
