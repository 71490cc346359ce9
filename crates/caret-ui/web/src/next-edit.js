// Next edit in the page (Tab, Tab): after a pause in typing the server is asked for the edit
// likely next after the recent ones (`/api/tab/next-edit`: the rest of a rename, the same
// change at the next similar place). It is marked where it would go, with what it becomes;
// Tab jumps there, Tab again applies it (and the next one is asked for); Esc or a keystroke
// drops it. Ghost text, when shown, takes Tab first.
import { post } from './api.js';

export function installNextEdit(monaco, editor, pathOf, openPath) {
  let edit = null; // { model, start, end, text, reason }
  let marks = [];
  let timer = null;
  let applying = false;

  // Shown, applied and dropped predictions are counted on the page's /metrics.
  const count = (what) => post('/api/tab/feedback', { event: `next_edit_${what}` }).catch(() => {});

  // `applied`: the prediction goes because Tab took it, not because it was dropped.
  const clear = (applied = false) => {
    if (edit && !applied) count('rejected');
    edit = null;
    window.caret.nextEdit = null;
    marks = editor.deltaDecorations(marks, []);
  };

  const show = (model, e) => {
    clear();
    if (!e || editor.getModel() !== model) return;
    if (e.path && e.path !== pathOf(model)) {
      // In another open file: said at the end of the cursor's line; Tab opens it there.
      edit = { model, ...e };
      const line = editor.getPosition().lineNumber;
      const end = model.getLineMaxColumn(line);
      marks = editor.deltaDecorations(marks, [
        {
          range: new monaco.Range(line, end, line, end),
          options: {
            showIfCollapsed: true,
            after: { content: ` ⇥ ${e.path}:${e.line} ${e.text.split('\n')[0]}`, inlineClassName: 'caret-next-edit-text' },
          },
        },
      ]);
      window.caret.nextEdit = { ...e };
      count('shown');
      return;
    }
    edit = { model, ...e };
    const a = model.getPositionAt(e.start);
    const b = model.getPositionAt(e.end);
    marks = editor.deltaDecorations(marks, [
      {
        range: new monaco.Range(a.lineNumber, a.column, b.lineNumber, b.column),
        options: {
          className: 'caret-next-edit',
          hoverMessage: { value: 'Tab: the same change here' },
          after: { content: ` ⇥ ${e.text.split('\n')[0]}`, inlineClassName: 'caret-next-edit-text' },
        },
      },
    ]);
    window.caret.nextEdit = { ...e, line: a.lineNumber };
    count('shown');
  };

  const ask = () => {
    const model = editor.getModel();
    const pos = editor.getPosition();
    if (!model || !pos) return;
    const version = model.getAlternativeVersionId();
    post('/api/tab/next-edit', { path: pathOf(model), text: model.getValue(), cursor: model.getOffsetAt(pos) })
      .then((e) => {
        if (model.getAlternativeVersionId() === version) show(model, e);
      })
      .catch(() => {});
  };

  // A file opened: its edits are followed from its text as opened.
  const follow = (model) =>
    post('/api/tab/next-edit', { path: pathOf(model), text: model.getValue(), cursor: 0, open: true }).catch(() => {});

  editor.onDidChangeModelContent(() => {
    if (applying) return;
    if (edit) clear();
    clearTimeout(timer);
    timer = setTimeout(ask, 400);
  });
  editor.onDidChangeModel(() => clear());

  // Tab: to the predicted edit when the cursor is on another line, else apply it. Taken on
  // key down, before Monaco's own Tab (indentation), unless ghost text or the suggest list is
  // up: those take Tab first.
  const take = async () => {
    if (edit.path && edit.path !== pathOf(edit.model)) {
      // Its file first: opened, the prediction shown there, the next Tab applies it.
      // The prediction as the server gave it, for the file about to be shown.
      const { model: _shownIn, path: file, ...e } = edit;
      edit = null;
      marks = editor.deltaDecorations(marks, []);
      await openPath(file, e.line);
      show(editor.getModel(), e);
      editor.setPosition(editor.getModel().getPositionAt(e.start));
      return;
    }
    const model = edit.model;
    const a = model.getPositionAt(edit.start);
    const pos = editor.getPosition();
    if (pos.lineNumber !== a.lineNumber) {
      editor.setPosition(a);
      editor.revealPositionInCenterIfOutsideViewport(a);
      return;
    }
    const b = model.getPositionAt(edit.end);
    const text = edit.text;
    clear(true);
    count('accepted');
    applying = true;
    editor.executeEdits('caret.nextEdit', [{ range: new monaco.Range(a.lineNumber, a.column, b.lineNumber, b.column), text }]);
    applying = false;
    editor.setPosition(model.getPositionAt(model.getOffsetAt(a) + text.length));
    ask();
  };
  const busy = () => {
    const dom = editor.getDomNode();
    return !!dom?.querySelector('[class*=ghost-text]') || !!dom?.querySelector('.suggest-widget.visible');
  };
  editor.onKeyDown((e) => {
    if (!edit || e.shiftKey || e.ctrlKey || e.altKey || e.metaKey) return;
    if (e.keyCode === monaco.KeyCode.Tab && !busy()) {
      e.preventDefault();
      e.stopPropagation();
      take();
    } else if (e.keyCode === monaco.KeyCode.Escape && !busy()) {
      // (With the suggest list or ghost text up, Esc closes those first.)
      e.preventDefault();
      e.stopPropagation();
      clear();
    }
  });
  return { follow };
}
