// With no model configured or installed, the page offers the default code model: its name
// and size, a Download button, then a progress bar while it downloads (a download cut short
// goes on from what it has). Once installed the server uses it at once; `ready` is called so
// the page picks up Tab's model.
import { get, post } from './api.js';

export async function offerModel(ready) {
  let offer;
  try {
    offer = await get('/api/models/default');
  } catch {
    return;
  }
  if (!offer.needed && offer.pull.state !== 'pulling') return;
  const bar = document.querySelector('#model-offer');
  const text = document.createElement('span');
  const button = document.createElement('button');
  button.className = 'primary small';
  const progress = document.createElement('progress');
  progress.hidden = true;
  bar.replaceChildren(text, button, progress);
  bar.hidden = false;
  const idle = (why, retry) => {
    text.textContent = `${why}Download the default code model, ${offer.model} (${offer.size_text}, runs on this machine's CPU)?`;
    button.textContent = retry ? 'Retry' : 'Download';
    button.hidden = false;
    progress.hidden = true;
  };
  const follow = async () => {
    button.hidden = true;
    progress.hidden = false;
    for (;;) {
      const now = await get('/api/models/default');
      const p = now.pull;
      progress.max = Math.max(1, p.total);
      progress.value = p.done;
      bar.dataset.state = p.state;
      if (p.state === 'pulling') {
        const pct = p.total ? Math.floor((p.done * 100) / p.total) : 0;
        text.textContent = `Downloading ${offer.model}: ${pct}%`;
        await new Promise((r) => setTimeout(r, 500));
        continue;
      }
      if (p.state === 'done') {
        text.textContent = `${offer.model} installed: Tab, next edit and the agent use it now.`;
        progress.hidden = true;
        await ready();
        setTimeout(() => (bar.hidden = true), 4000);
      } else {
        idle(`The download failed (${p.error || 'no reason given'}). `, true);
      }
      return;
    }
  };
  button.onclick = async () => {
    try {
      await post('/api/models/default', {});
    } catch (e) {
      idle(`The download did not start (${e.message}). `, true);
      return;
    }
    follow();
  };
  window.caret.modelOffer = offer;
  if (offer.pull.state === 'pulling') follow();
  else if (offer.pull.state === 'failed') idle(`The download failed (${offer.pull.error}). `, true);
  else idle('No model is configured. ', false);
}
